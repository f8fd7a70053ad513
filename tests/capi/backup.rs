//! `handoff move --to-directory` and `--from-directory` on the real Cluster API: a backup of a
//! management cluster, the cluster lost, and a restore into a fresh one that re-provisions the
//! workload cluster. Nothing of handoff is installed in either.
//!
//! What is proven, from the clusters' own records (every write of one API server has its
//! etcd revision, the object's `resourceVersion`, so a write is placed exactly between two
//! others): in the backup, clusterctl's pause and unpause of the Cluster (between which it
//! reads and writes the files) fall inside the window's hold of every provider Lease, and
//! handoff's own pause before it falls before it (the providers lift their block-move only
//! while they run); in the restore, every object clusterctl creates and its unpause of the
//! Cluster fall inside the hold of every provider Lease of the fresh cluster. Each is first
//! run with a clusterctl that fails: the backup puts everything back, the restore keeps its
//! controllers stopped for the same command again.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support;
use support::apiserver::{eventually, skip, text};
use support::capi::{BLOCK_MOVE, Event, MovedObjects, PROVIDERS, Rig, Watch, held_at, rv};

/// `handoff move` with `clusterctl` (the rig's, or one that fails) and `args`.
fn handoff_move(rig: &Rig, clusterctl: &Path, args: &[&str]) -> (bool, String) {
    let (code, log) = handoff_move_code(rig, clusterctl, args);
    (code == Some(0), log)
}

/// The same, with handoff's exit code.
fn handoff_move_code(rig: &Rig, clusterctl: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = rig
        .handoff(clusterctl, args)
        .output()
        .expect("handoff move");
    (out.status.code(), text(&out.stderr) + &text(&out.stdout))
}

/// The Cluster's `spec.paused` as each write left it: `(revision, paused)`.
fn pauses(seen: &MovedObjects, key: &str) -> Vec<(u64, bool)> {
    let mut out: Vec<(u64, bool)> = Vec::new();
    for e in seen.events() {
        if e.object["kind"] != "Cluster" || e.key() != key || e.kind == "DELETED" {
            continue;
        }
        let p = e.object["spec"]["paused"] == true;
        if out.last().is_none_or(|(_, was)| *was != p) {
            out.push((rv(&e), p));
        }
    }
    out
}

fn wait_listed(what: &str, seen: &MovedObjects, leases: &Watch) {
    eventually(what, Duration::from_secs(120), || {
        let keys: Vec<String> = leases.events().iter().map(|e| e.key()).collect();
        (seen.listed()
            && PROVIDERS
                .iter()
                .all(|(ns, _, l)| keys.contains(&format!("{ns}/{l}"))))
        .then_some(())
    });
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_backup_and_a_restore_into_a_fresh_cluster_with_the_controllers_stopped() {
    if skip()
        || !support::netns::in_own_netns(
            "backup::a_backup_and_a_restore_into_a_fresh_cluster_with_the_controllers_stopped",
        )
    {
        return;
    }
    let Some(rig) = Rig::find() else {
        return;
    };
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut clusters = rig.up(dir.path(), &["lost", "fresh"], &[]);
    let fresh = clusters.pop().unwrap();
    let lost = clusters.pop().unwrap();
    let w = lost
        .workload(&rig, "ns1", "wl1", 1)
        .wait_with_output()
        .expect("workload.sh");
    assert!(w.status.success(), "workload: {}", text(&w.stderr));
    eprintln!("set up in {:.1}s", t0.elapsed().as_secs_f64());
    let backup = dir.path().join("backup");
    std::fs::create_dir_all(&backup).expect("backup folder");
    let real = rig.clusterctl();
    let failing = dir.path().join("clusterctl-that-fails");
    std::fs::write(&failing, "#!/bin/sh\necho 'injected failure' >&2\nexit 3\n").expect("script");
    std::fs::set_permissions(
        &failing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let kubeconfig = lost.kubeconfig.display().to_string();
    let to = backup.display().to_string();
    let backup_args = [
        "--kubeconfig",
        kubeconfig.as_str(),
        "--namespace",
        "ns1",
        "--to-directory",
        to.as_str(),
    ];

    // A backup whose clusterctl fails puts everything back: the Cluster unpaused, the
    // controllers leading, nothing of handoff left. Its progress as a pipeline reads it
    // (`-o json`): the backup's steps, in order, and clusterctl's exit code as handoff's.
    let json_args = [&backup_args[..], &["-o", "json"]].concat();
    let (code, log) = handoff_move_code(&rig, &failing, &json_args);
    eprintln!("a failing backup:\n{log}");
    assert_eq!(code, Some(3), "clusterctl's exit code:\n{log}");
    assert!(
        log.contains("The controllers and the Clusters are back as they were"),
        "{log}"
    );
    let steps: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "step" && e["of"] == "backup")
        .map(|e| e["step"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        steps,
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
    let c = lost.get(&["-n", "ns1", "clusters.cluster.x-k8s.io", "wl1"]);
    assert_ne!(c["spec"]["paused"], true, "{c}");
    lost.nothing_of_handoff_at_all();
    eventually(
        "lost: the providers lead again",
        Duration::from_secs(120),
        || lost.providers_lead().then_some(()),
    );

    // The backup.
    let (objects, leases) = (
        MovedObjects::start(&lost, "ns1"),
        Watch::start(&lost, &["leases", "-A"]),
    );
    wait_listed("lost: the watches listing", &objects, &leases);
    let t = Instant::now();
    let (ok, log) = handoff_move(&rig, &real, &backup_args);
    eprintln!(
        "handoff move --to-directory ({:.1}s):\n{log}",
        t.elapsed().as_secs_f64()
    );
    assert!(ok, "{log}");
    assert!(log.contains("handoff move: backup done"), "{log}");
    // handoff paused the Cluster while the controllers ran, then unpaused it with them stopped;
    // clusterctl paused it, wrote the files and unpaused it, all within the hold.
    let p = pauses(&objects, "ns1/wl1");
    assert_eq!(
        p.iter().map(|(_, b)| *b).collect::<Vec<_>>(),
        [false, true, false, true, false],
        "the Cluster's pauses: {p:?}"
    );
    assert!(
        held_at(&lost, &leases, p[1].0).is_err(),
        "handoff paused the Cluster with the controllers running, for them to lift their block-move"
    );
    for (what, at) in [
        ("handoff's unpause", p[2].0),
        ("clusterctl's pause", p[3].0),
        ("clusterctl's unpause", p[4].0),
    ] {
        held_at(&lost, &leases, at).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let files: Vec<(String, String)> = std::fs::read_dir(&backup)
        .expect("the backup folder")
        .map(|e| {
            let path = e.expect("entry").path();
            let body = std::fs::read_to_string(&path).expect("a backed-up object");
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                body,
            )
        })
        .collect();
    assert!(files.len() >= 6, "{files:?}");
    for (name, body) in &files {
        assert!(
            !body.contains(BLOCK_MOVE),
            "{name} still carries a block-move:\n{body}"
        );
        assert!(
            !body.contains("handoff"),
            "{name} carries something of handoff:\n{body}"
        );
    }
    let c = lost.get(&["-n", "ns1", "clusters.cluster.x-k8s.io", "wl1"]);
    assert_ne!(c["spec"]["paused"], true, "{c}");
    lost.nothing_of_handoff_at_all();
    eventually(
        "lost: the providers lead again",
        Duration::from_secs(120),
        || lost.providers_lead().then_some(()),
    );
    drop((objects, leases));
    // The management cluster is lost.
    drop(lost);

    // The restore into a fresh management cluster.
    let (objects, leases) = (
        MovedObjects::start(&fresh, "ns1"),
        Watch::start(&fresh, &["leases", "-A"]),
    );
    wait_listed("fresh: the watches listing", &objects, &leases);
    let kubeconfig = fresh.kubeconfig.display().to_string();
    let restore_args = [
        "--to-kubeconfig",
        kubeconfig.as_str(),
        "--from-directory",
        to.as_str(),
    ];
    // A restore whose clusterctl fails keeps the controllers stopped; the same command again
    // runs clusterctl again with them still stopped.
    let (code, log) = handoff_move_code(&rig, &failing, &restore_args);
    eprintln!("a failing restore:\n{log}");
    assert_eq!(code, Some(3), "clusterctl's exit code:\n{log}");
    assert!(
        log.contains("The controllers handoff stopped stay stopped"),
        "{log}"
    );
    assert!(fresh.window_holds_every_provider_lease(), "{log}");
    let record = &fresh.get(&["movewindow", "restore"])["status"]["move"];
    assert_eq!(record["phase"], "Failed", "{record}");
    assert_eq!(record["clusterctlExit"], 3, "{record}");
    // `--abort` brings them back instead, and takes away what the window brought.
    let abort_args = [&restore_args[..], &["--abort"]].concat();
    let (ok, log) = handoff_move(&rig, &failing, &abort_args);
    eprintln!("the failed restore aborted:\n{log}");
    assert!(ok, "{log}");
    assert!(
        log.contains("handoff move --abort: the controllers are back"),
        "{log}"
    );
    assert!(!fresh.window_holds_any_provider_lease(), "{log}");
    fresh.nothing_of_handoff_at_all();
    eventually(
        "fresh: the providers lead again after the abort",
        Duration::from_secs(120),
        || fresh.providers_lead().then_some(()),
    );
    // Failed once more, then finished by the same command.
    let (code, log) = handoff_move_code(&rig, &failing, &restore_args);
    assert_eq!(code, Some(3), "clusterctl's exit code:\n{log}");
    assert!(fresh.window_holds_every_provider_lease(), "{log}");
    let t = Instant::now();
    let (ok, log) = handoff_move(&rig, &real, &restore_args);
    eprintln!(
        "handoff move --from-directory ({:.1}s):\n{log}",
        t.elapsed().as_secs_f64()
    );
    assert!(ok, "{log}");
    assert!(
        log.contains("its controllers stay stopped, and clusterctl runs again")
            && log.contains("handoff move: restore done"),
        "{log}"
    );
    let events = objects.events();
    let created: Vec<&Event> = events.iter().filter(|e| e.kind == "ADDED").collect();
    assert!(
        created.len() + 1 >= files.len(),
        "created {} of {} files",
        created.len(),
        files.len()
    );
    for e in &created {
        held_at(&fresh, &leases, rv(e)).unwrap_or_else(|why| {
            panic!(
                "{} {} created outside the hold: {why}",
                e.object["kind"],
                e.key()
            )
        });
    }
    let p = pauses(&objects, "ns1/wl1");
    let unpaused = p
        .iter()
        .find(|(_, paused)| !paused)
        .unwrap_or_else(|| panic!("{p:?}"));
    held_at(&fresh, &leases, unpaused.0).unwrap_or_else(|e| panic!("clusterctl's unpause: {e}"));
    fresh.nothing_of_handoff_at_all();
    let said = eventually(
        "fresh: ns1/wl1 re-provisioned by its controllers",
        Duration::from_secs(240),
        || fresh.provisioned("ns1", "wl1", 2),
    );
    eprintln!("{said}; whole test {:.1}s", t0.elapsed().as_secs_f64());
}
