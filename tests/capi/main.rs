//! `handoff move` on the real Cluster API (`../shared/capi`): the real clusterctl and the real
//! core, kubeadm bootstrap, kubeadm control-plane and CAPD managers.
//!
//! - `moves`: moves as shipped (15 s leases), there and back, proven from the clusters.
//! - `crash`: `handoff move` killed at its crash points, then finished or undone (its cases:
//!   `crash_cases`; what "nothing lost" compares: `crash_graph`; a backup and a restore killed:
//!   `crash_directory`; API servers restarted, pods lost, handoff down: `crash_faults`).
//! - `classes`: a ClusterClass shared across namespaces, each namespace moved, the class's last;
//!   then the rest in one `handoff move -A`, killed inside its second namespace (`whole`), and
//!   the whole target backed up, lost and restored, each first with a clusterctl that fails
//!   (`whole_backup`).
//! - `pivot`: the book's "Pivot from a bootstrap cluster" page, its commands run in order.
//!
//! One test binary for both, so that they run at the same time: `cargo test` runs test binaries
//! one after another, and libtest runs the tests of one binary on its threads. Each suite spends
//! most of its minutes waiting on leases and on re-provisioning (the machine was 70% idle while
//! one ran alone), and each runs in a network namespace of its own with management clusters of
//! its own, so neither sees the other. `cargo test --test capi moves::` (or `crash::`) runs one.

#[path = "../support/mod.rs"]
mod support;

mod classes;
mod crash;
mod crash_cases;
mod crash_directory;
mod crash_faults;
mod crash_graph;
mod moves;
mod pivot;
mod proofs;
mod whole;
mod whole_backup;
