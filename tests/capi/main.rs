//! `handoff move` on the real Cluster API (`../shared/capi`): the real clusterctl and the real
//! core, kubeadm bootstrap, kubeadm control-plane and CAPD managers.
//!
//! - `backup`: `handoff move --to-directory`, the cluster lost, `--from-directory` into a fresh one.
//! - `moves`: moves as shipped (15 s leases), there and back, proven from the clusters.
//! - `crash`: `handoff move` killed at its crash points, then finished or undone (its cases:
//!   `crash_cases`; what "nothing lost" compares: `crash_graph`; a backup and a restore killed:
//!   `crash_directory`; API servers restarted, pods lost, handoff down: `crash_faults`).
//! - `classes`: a ClusterClass shared across namespaces, each namespace moved, the class's last.
//! - `pivot`: the book's "Pivot from a bootstrap cluster" page, its commands run in order.
//!
//! One test binary for all, so that they run at the same time: `cargo test` runs test binaries
//! one after another, and libtest runs the tests of one binary on its threads. Each suite spends
//! most of its minutes waiting on leases and on re-provisioning (the machine was 70% idle while
//! one ran alone), and each runs in a network namespace of its own with management clusters of
//! its own, so none sees another. `cargo test --test capi moves::` (or `crash::`) runs one.
//!
//! libtest runs as many tests at once as there are cores unless told otherwise, two in CI: six
//! suites of 5 to 20 minutes, mostly waiting, then ran two by two, and the longest (the crash
//! halves, sorted after `backup` and `classes`) started last. So this binary asks libtest for
//! all six at once (`RUST_TEST_THREADS`, set before `main` unless the caller set it; the
//! re-executed test in its namespace is given `--test-threads 1`, which wins).

#[path = "../support/mod.rs"]
mod support;

mod backup;
mod classes;
mod crash;
mod crash_cases;
mod crash_directory;
mod crash_faults;
mod crash_graph;
mod moves;
mod pivot;
mod proofs;

/// Before libtest's `main` reads it: every suite of this binary at once (see above).
#[used]
#[unsafe(link_section = ".init_array")]
static ALL_SUITES_AT_ONCE: extern "C" fn() = all_suites_at_once;

extern "C" fn all_suites_at_once() {
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        // SAFETY: run from the loader's constructors, before `main`: no other thread exists yet
        // to read or write the environment.
        unsafe { std::env::set_var("RUST_TEST_THREADS", "6") };
    }
}

#[test]
fn the_suites_are_run_at_once_unless_the_caller_says_otherwise() {
    let threads = std::env::var("RUST_TEST_THREADS").expect("set before main");
    assert!(threads.parse::<usize>().is_ok_and(|n| n >= 1), "{threads}");
}
