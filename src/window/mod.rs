//! Move windows: the MoveWindow resource and the `handoff window` commands.

pub mod resource;
