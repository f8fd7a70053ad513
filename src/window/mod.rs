//! The `handoff window` commands and `handoff move`: open, close and inspect move windows on
//! one cluster or on both clusters of a move, move a namespace with clusterctl, back it up and
//! restore it.
//!
//! The house, by what each part may do:
//! - `plan`: pure. Each command's planner (what was read and what this run did → the one next
//!   step) and the decisions they share; nothing here reads a cluster, a clock or a process.
//! - `runner`: the one loop every command runs on (read, ask the planner, perform, record),
//!   waiting on the step, clusterctl and the signals together.
//! - `open`, `close`, `mover`: the performers, one function per step, which decide nothing.
//! - `cluster`: reading and writing a cluster (the window's record, Deployments, Leases, what
//!   of handoff guards it).
//! - `child`, `progress`, `user_agent`: the edges (clusterctl's process, what is said, the
//!   clients' User-Agent).
//!
//! Every step reads what the cluster already holds before it writes, and records what it did
//! in the window's status, so a command that died midway is finished by running it again.

mod child;
mod close;
pub mod cluster;
mod mover;
mod open;
pub mod plan;
pub mod progress;
mod runner;
pub mod user_agent;

pub use close::{CLOSE_POLL, CLOSE_SETTLE, CloseOptions, Restored, close};
pub use cluster::preflight::preflight;
pub use cluster::status::{DeploymentReport, LeaseReport, WindowReport, render_table, status};
pub use cluster::{Cluster, Finding, Label, On, WindowError};
pub use mover::{
    DirectoryOptions, MOVE_POLL, MoveOptions, directory_run, run as move_run, whole_namespaces,
    whole_run,
};
pub use open::{OPEN_POLL, OpenOptions, check, open, plan_open};
