//! `handoff move -A --to-directory` and `-A --from-directory` on the real Cluster API: the
//! whole target of `whole.rs` backed up (a folder per namespace, one stop), the cluster lost,
//! and everything restored into the other cluster (one stop), each first run with a clusterctl
//! that fails.
//!
//! What is proven, from the cluster's own records (every write of one API server has its etcd
//! revision, the object's `resourceVersion`, so a write is placed exactly between two others):
//! - the backup: handoff pauses every Cluster while the controllers run (the providers lift
//!   their block-move only while they run), unpauses it inside the window's hold of every
//!   provider Lease, and clusterctl's pause and unpause (between which it reads and writes the
//!   files) fall inside that hold too; a failing clusterctl puts everything back;
//! - the restore: every object clusterctl creates and its unpause of each Cluster fall inside
//!   the hold of every provider Lease of the cluster restored into (which `classes.rs` then
//!   sees re-provision every workload cluster); a failing clusterctl keeps
//!   the controllers stopped for the same command again, and `--abort` brings them back.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::classes::paused;
use crate::support;
use crate::whole::{holds_taken, inside_the_stop, log_of, watch};
use support::apiserver::eventually;
use support::capi::{BLOCK_MOVE, Mgmt, MovedObjects, Rig, held_at, rv};

/// The Clusters of the whole shape, whose pauses the proofs read.
const CLUSTERS: [&str; 3] = ["team-a/a1", "team-b/b1", "legacy/l1"];

/// A clusterctl that fails as a real one does when it cannot finish: a message and exit 3.
fn failing_clusterctl(dir: &Path) -> PathBuf {
    let path = dir.join("clusterctl-that-fails");
    std::fs::write(&path, "#!/bin/sh\necho 'injected failure' >&2\nexit 3\n").expect("script");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    path
}

/// `handoff move -A` with `clusterctl` and `args`.
fn whole_with(rig: &Rig, clusterctl: &Path, args: &[&str]) -> Output {
    rig.handoff(clusterctl, &[&["--all-namespaces"], args].concat())
        .output()
        .expect("handoff move -A")
}

/// The Cluster `key`'s `spec.paused` as each write left it, in the order of the cluster's
/// etcd revisions: `(revision, paused)`, one entry per change.
fn pauses(seen: &MovedObjects, key: &str) -> Vec<(u64, bool)> {
    let mut events: Vec<_> = seen
        .events()
        .into_iter()
        .filter(|e| e.object["kind"] == "Cluster" && e.key() == key && e.kind != "DELETED")
        .collect();
    events.sort_by_key(rv);
    let mut out: Vec<(u64, bool)> = Vec::new();
    for e in events {
        let p = e.object["spec"]["paused"] == true;
        if out.last().is_none_or(|(_, was)| *was != p) {
            out.push((rv(&e), p));
        }
    }
    out
}

/// The backup's steps as a pipeline reads them (`-o json`), in order.
fn backup_steps(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "step" && e["of"] == "backup")
        .map(|e| e["step"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn providers_lead_again(m: &Mgmt, after: &str) {
    eventually(
        &format!("{}: the providers lead again after {after}", m.name),
        Duration::from_secs(120),
        || m.providers_lead().then_some(()),
    );
}

/// A whole backup whose clusterctl fails puts everything back: every Cluster unpaused, the
/// controllers leading, nothing of handoff left, clusterctl's exit code as handoff's.
fn a_failing_backup(rig: &Rig, from: &Mgmt, failing: &Path, to: &str) {
    let kubeconfig = from.kubeconfig.display().to_string();
    let out = whole_with(
        rig,
        failing,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--to-directory",
            to,
            "-o",
            "json",
        ],
    );
    let log = log_of(&out);
    eprintln!("a failing whole backup:\n{log}");
    assert_eq!(out.status.code(), Some(3), "clusterctl's exit code:\n{log}");
    assert!(
        log.contains("The controllers and the Clusters are back as they were"),
        "{log}"
    );
    assert_eq!(
        backup_steps(&log),
        [
            "Check",
            "Record",
            "Pause",
            "WaitUnblocked",
            "Stop",
            "Unpause",
            "RunClusterctl",
            "PutBack",
            "Fail",
            "Uninstall"
        ],
        "{log}"
    );
    assert!(paused(from).is_empty(), "{:?}", paused(from));
    from.nothing_of_handoff_at_all();
    providers_lead_again(from, "the failed backup");
}

/// The whole backup, then its proof from the cluster's records and the folders' files.
fn the_backup(rig: &Rig, from: &Mgmt, folder: &Path, namespaces: &[&str]) {
    let (objects, leases) = watch(from);
    let to = folder.display().to_string();
    let kubeconfig = from.kubeconfig.display().to_string();
    let t = Instant::now();
    let out = whole_with(
        rig,
        &rig.clusterctl(),
        &["--kubeconfig", &kubeconfig, "--to-directory", &to],
    );
    let log = log_of(&out);
    eprintln!(
        "handoff move -A --to-directory ({:.1}s):\n{log}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success() && log.contains("handoff move: backup done"),
        "{log}"
    );
    assert_eq!(
        log.matches("MoveWindow backup-all-namespaces is Open")
            .count(),
        1,
        "one stop:\n{log}"
    );
    // handoff paused each Cluster while the controllers ran, then unpaused it with them
    // stopped; clusterctl paused it, wrote the files and unpaused it, all within the hold.
    for cluster in CLUSTERS {
        let p = pauses(&objects, cluster);
        assert_eq!(
            p.iter().map(|(_, b)| *b).collect::<Vec<_>>(),
            [false, true, false, true, false],
            "the pauses of {cluster}: {p:?}"
        );
        assert!(
            held_at(from, &leases, p[1].0).is_err(),
            "handoff paused {cluster} with the controllers running, for them to lift their block-move"
        );
        for (what, at) in [
            ("handoff's unpause", p[2].0),
            ("clusterctl's pause", p[3].0),
            ("clusterctl's unpause", p[4].0),
        ] {
            held_at(from, &leases, at).unwrap_or_else(|e| panic!("{what} of {cluster}: {e}"));
        }
    }
    for ns in namespaces {
        let files: Vec<(String, String)> = std::fs::read_dir(folder.join(ns))
            .unwrap_or_else(|e| panic!("the folder of {ns}: {e}"))
            .map(|e| {
                let path = e.expect("entry").path();
                let body = std::fs::read_to_string(&path).expect("a backed-up object");
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, body)
            })
            .collect();
        assert!(
            files
                .iter()
                .any(|(f, _)| f.starts_with("Cluster_") || f.starts_with("ClusterClass_")),
            "{ns}: {:?}",
            files.iter().map(|(f, _)| f).collect::<Vec<_>>()
        );
        for (name, body) in &files {
            assert!(
                !body.contains(BLOCK_MOVE),
                "{ns}/{name} still carries a block-move:\n{body}"
            );
            // Nothing of handoff: no mark, no field manager (the test CRD's group is the one
            // `handoff` a file may hold).
            assert!(
                !body
                    .replace("identity.handoff.test", "")
                    .contains("handoff"),
                "{ns}/{name} carries something of handoff:\n{body}"
            );
        }
    }
    assert!(paused(from).is_empty(), "{:?}", paused(from));
    from.nothing_of_handoff_at_all();
}

/// A whole restore whose clusterctl fails keeps the controllers stopped (they would reconcile
/// a half-restored management cluster); `--abort` brings them back; failed once more, it is
/// left for the same command to finish.
fn a_failing_restore_aborted_and_failed_again(rig: &Rig, into: &Mgmt, failing: &Path, to: &str) {
    let kubeconfig = into.kubeconfig.display().to_string();
    let args = [
        "--to-kubeconfig",
        kubeconfig.as_str(),
        "--from-directory",
        to,
    ];
    let out = whole_with(rig, failing, &args);
    let log = log_of(&out);
    eprintln!("a failing whole restore:\n{log}");
    assert_eq!(out.status.code(), Some(3), "clusterctl's exit code:\n{log}");
    assert!(
        log.contains("The controllers handoff stopped stay stopped"),
        "{log}"
    );
    assert!(into.window_holds_every_provider_lease(), "{log}");
    let record = &into.get(&["movewindow", "restore"])["status"]["move"];
    assert_eq!(record["phase"], "Failed", "{record}");
    assert_eq!(record["clusterctlExit"], 3, "{record}");

    let out = whole_with(rig, failing, &[&args[..], &["--abort"]].concat());
    let log = log_of(&out);
    eprintln!("the failed whole restore aborted:\n{log}");
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("handoff move --abort: the controllers are back"),
        "{log}"
    );
    assert!(!into.window_holds_any_provider_lease(), "{log}");
    into.nothing_of_handoff_at_all();
    providers_lead_again(into, "the abort");

    let out = whole_with(rig, failing, &args);
    let log = log_of(&out);
    assert_eq!(out.status.code(), Some(3), "clusterctl's exit code:\n{log}");
    assert!(into.window_holds_every_provider_lease(), "{log}");
}

/// The same restore command, with the real clusterctl, finishes what the failed one left: every
/// create and every Cluster's unpause inside the one stop it kept.
fn the_restore_finished(rig: &Rig, into: &Mgmt, to: &str, namespaces: &[&str]) {
    let (objects, leases) = watch(into);
    let kubeconfig = into.kubeconfig.display().to_string();
    let t = Instant::now();
    let out = whole_with(
        rig,
        &rig.clusterctl(),
        &["--to-kubeconfig", &kubeconfig, "--from-directory", to],
    );
    let log = log_of(&out);
    eprintln!(
        "handoff move -A --from-directory ({:.1}s):\n{log}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success()
            && log.contains("its controllers stay stopped, and clusterctl runs again")
            && log.contains("handoff move: restore done"),
        "{log}"
    );
    // The stop the failed restore kept, not a second one: the window took each Lease once.
    for (lease, taken) in holds_taken(&leases) {
        assert_eq!(
            taken, 1,
            "{}: {lease} taken {taken} times:\n{log}",
            into.name
        );
    }
    for ns in namespaces {
        assert!(
            log.contains(&format!("namespace {ns}: running")),
            "{ns}:\n{log}"
        );
    }
    let created = inside_the_stop(into, &objects, &leases, "ADDED", namespaces);
    for cluster in CLUSTERS {
        let p = pauses(&objects, cluster);
        let unpaused = p
            .iter()
            .find(|(_, paused)| !paused)
            .unwrap_or_else(|| panic!("{cluster}: {p:?}"));
        held_at(into, &leases, unpaused.0)
            .unwrap_or_else(|e| panic!("clusterctl's unpause of {cluster}: {e}"));
    }
    eprintln!("{created} creates, all inside the restore's one stop");
    into.nothing_of_handoff_at_all();
}

/// The target backed up whole (`-A --to-directory`), lost, and restored whole into the other
/// cluster (`-A --from-directory`), each under one stop of its cluster, each first failed.
pub fn backed_up_lost_and_restored(
    rig: &Rig,
    from: Mgmt,
    into: &Mgmt,
    dir: &Path,
    namespaces: &[&str],
) {
    let folder = dir.join("whole-backup");
    std::fs::create_dir_all(&folder).expect("backup folder");
    let to = folder.display().to_string();
    let failing = failing_clusterctl(dir);
    a_failing_backup(rig, &from, &failing, &to);
    the_backup(rig, &from, &folder, namespaces);
    // The management cluster is lost.
    drop(from);
    a_failing_restore_aborted_and_failed_again(rig, into, &failing, &to);
    the_restore_finished(rig, into, &to, namespaces);
}
