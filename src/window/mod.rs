//! Move windows: the MoveWindow resource and the `handoff window` commands.

pub mod ops;
pub mod resource;
