//! Pure decisions: functions from a request and the state they need to a verdict or a patch.
//! No I/O, no clocks, no caches; the edge (`crate::webhook`) gathers what they read.

pub mod identity;
pub mod move_window;
pub mod selector;
pub mod sync_finalizer;
