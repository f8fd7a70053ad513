//! API types that the caches, the webhook edge and the commands share.

pub mod move_window;
pub mod phase;
