//! The `handoff window` commands: open, close and inspect move windows on one cluster or on
//! both clusters of a move.
//!
//! Every step reads what the cluster already holds before it writes, and records what it did
//! in the window's status, so a command that died midway is finished by running it again.
//! `plan` decides (which strategy, which count, what a Lease take-over writes, which order);
//! the command modules read, ask it, and write.

mod child;
mod close;
mod common;
pub mod declare;
pub mod directory_next;
pub mod directory_plan;
pub mod installed;
mod lease;
pub mod move_next;
pub mod move_plan;
mod mover;
mod open;
pub mod plan;
pub mod planner;
mod pod_watch;
mod preflight;
pub mod progress;
pub mod proof;
mod runner;
mod standby;
mod status;
pub mod user_agent;
pub mod window_next;
pub mod window_webhook;

pub use close::{CLOSE_POLL, CLOSE_SETTLE, CloseOptions, Restored, close};
pub use common::{Cluster, Finding, Label, On, WindowError};
pub use mover::{DirectoryOptions, MOVE_POLL, MoveOptions, directory_run, run as move_run};
pub use open::{OPEN_POLL, OpenOptions, check, open, plan_open};
pub use preflight::preflight;
pub use status::{DeploymentReport, LeaseReport, WindowReport, render_table, status};
