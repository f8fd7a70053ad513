//! The `handoff window` commands.

pub mod ops;
