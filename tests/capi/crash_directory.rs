//! A backup and a restore killed at a step of their own (`crash.rs`, the first half's clusters,
//! after the move's cases): `handoff move --to-directory` of the namespace, killed, then the
//! same command or `--abort` first; then `--from-directory` of that folder into the other
//! cluster, killed, then the same. After each: the Clusters unpaused, every controller back,
//! nothing of handoff left, and the folder as an uninterrupted backup writes it, or the
//! namespace whole in the cluster restored into.
//!
//! Their requests name their steps as the move's do (`handoff/<version> (backup step Pause)`);
//! at `RunClusterctl` the kill lands during clusterctl's first write (its pause of the Cluster
//! in a backup, its first create in a restore). Every run takes one step of each and a way,
//! turning with the move's cases; `HANDOFF_CRASH_CASES=all` takes them all.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::support::capi::{Mgmt, Rig};
use crate::support::crash_proxy::{Agent, CrashProxies, Cue};

use super::crash::{self, Graph, NS, Run};
use super::crash_cases::Then;

/// The steps of a backup that write (`mover/directory.rs`; its `Check` and `WaitUnblocked`
/// only read).
pub const BACKUP_STEPS: [&str; 7] = [
    "Record",
    "Pause",
    "Stop",
    "Unpause",
    "RunClusterctl",
    "PutBack",
    "Uninstall",
];
/// The steps of a restore that write.
pub const RESTORE_STEPS: [&str; 5] = ["Record", "Stop", "RunClusterctl", "Restore", "Uninstall"];

/// A case: the step killed at, and the way on.
pub type StepCase = (&'static str, Then);

/// Which backup and restore cases run: `(step, way)` of each, one of each for `seed`, or all.
pub fn chosen(seed: usize, all: bool) -> (Vec<StepCase>, Vec<StepCase>) {
    fn cases(steps: &[&'static str]) -> Vec<StepCase> {
        steps
            .iter()
            .flat_map(|s| [(*s, Then::Rerun), (*s, Then::Abort)])
            .collect()
    }
    let (backup, restore) = (cases(&BACKUP_STEPS), cases(&RESTORE_STEPS));
    match all {
        true => (backup, restore),
        false => (
            vec![backup[seed % backup.len()]],
            vec![restore[seed % restore.len()]],
        ),
    }
}

/// Where a case's kill lands.
fn cue(step: &'static str) -> Cue {
    match step {
        "RunClusterctl" => Cue::NthOf {
            agent: Agent::Clusterctl,
            nth: 1,
        },
        step => Cue::KthStep {
            steps: vec![step],
            k: 1,
        },
    }
}

/// `handoff move ARGS` through the proxies, with the rig's clusterctl.
fn directory_cmd(rig: &Rig, args: &[&str]) -> Command {
    rig.handoff(&rig.clusterctl(), args)
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The files of a backup folder.
fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("the backup folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// Killed at `step`, then `then` and the same command until it succeeds (`stopped`: the cluster
/// whose controllers it stops); returns what it said.
#[allow(clippy::too_many_arguments)]
fn killed_then_finished(
    rig: &Rig,
    proxies: &CrashProxies,
    here: usize,
    stopped: &Mgmt,
    args: &[&str],
    step: &'static str,
    then: Then,
    what: &str,
) -> String {
    let mut said = String::new();
    let killed = crash::run_handoff(
        rig,
        proxies,
        here,
        directory_cmd(rig, args),
        vec![cue(step)],
    );
    assert!(
        killed.killed && !killed.ok,
        "{what}: never reached its step {step}:\n{}",
        killed.log
    );
    for (cue, w) in &killed.acted {
        said.push_str(&format!("{cue} (at {}); ", w.label));
    }
    if then == Then::Abort {
        let abort = [args, &["--abort"]].concat();
        let aborted: Run =
            crash::run_handoff(rig, proxies, here, directory_cmd(rig, &abort), vec![]);
        assert!(aborted.ok, "{what}: --abort:\n{}", aborted.log);
        // Undone before the same command runs again: the Clusters unpaused, every controller
        // of the cluster it stopped back, nothing of handoff left there.
        assert_eq!(
            crash::paused_clusters(stopped),
            Vec::<String>::new(),
            "{what}: after --abort"
        );
        crash::restored(stopped, &format!("{what}, after --abort"));
        said.push_str("--abort undid it; ");
    }
    let again = crash::run_handoff(rig, proxies, here, directory_cmd(rig, args), vec![]);
    assert!(
        again.ok,
        "{what}: the same command again:\n{}\nthe killed run:\n{}",
        again.log, killed.log
    );
    said.push_str("the same command finished it");
    said
}

/// A backup of `from` and a restore into `to`, each killed at a step of its own (see the
/// header); `here` is `from`'s index among the proxies'.
#[allow(clippy::too_many_arguments)]
pub fn backup_and_restore_killed(
    rig: &Rig,
    proxies: &CrashProxies,
    [from, to]: [&Mgmt; 2],
    here: usize,
    before: &Graph,
    dir: &Path,
    seed: usize,
    all: bool,
) {
    let (backups, restores) = chosen(seed, all);
    let kubeconfig = proxies.kubeconfigs[here].display().to_string();
    // A backup of the namespace into a new folder `name` under `dir`: the folder and the args.
    let backup = |name: &str| {
        let folder = dir.join(name);
        std::fs::create_dir_all(&folder).expect("backup folder");
        let arg = folder.display().to_string();
        let args: Vec<String> = [
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            NS,
            "--to-directory",
            &arg,
        ]
        .map(String::from)
        .into();
        (folder, args)
    };
    // The reference: a backup not interrupted, for the files a complete one writes.
    let (reference, args) = backup("backup-reference");
    let r = crash::run_handoff(rig, proxies, here, directory_cmd(rig, &strs(&args)), vec![]);
    assert!(r.ok, "the reference backup:\n{}", r.log);
    let complete = files(&reference);
    assert!(complete.len() >= 6, "the reference backup: {complete:?}");
    let mut folder = reference.clone();
    for (i, (step, then)) in backups.into_iter().enumerate() {
        let t = Instant::now();
        let what = format!("backup of {} killed at {step}, then {then:?}", from.name);
        let (d, args) = backup(&format!("backup-{i}"));
        let said = killed_then_finished(rig, proxies, here, from, &strs(&args), step, then, &what);
        assert_eq!(
            files(&d),
            complete,
            "{what}: the folder is not what a backup not interrupted writes"
        );
        assert_eq!(crash::paused_clusters(from), Vec::<String>::new(), "{what}");
        crash::restored(from, &what);
        crash::shown(&format!(
            "{what}: passed in {:.1}s: {said}",
            t.elapsed().as_secs_f64()
        ));
        folder = d;
    }
    let folder_arg = folder.display().to_string();
    let to_kubeconfig = proxies.kubeconfigs[1 - here].display().to_string();
    let args = [
        "--to-kubeconfig",
        &to_kubeconfig,
        "--from-directory",
        &folder_arg,
    ];
    for (step, then) in restores {
        let t = Instant::now();
        let what = format!("restore into {} killed at {step}, then {then:?}", to.name);
        // Each restore starts as the first did: no MoveWindow of an earlier one.
        to.delete_all_windows();
        let said = killed_then_finished(rig, proxies, here, to, &args, step, then, &what);
        let differ = crash::differences(before, &crash::graph(to));
        assert!(
            differ.is_empty(),
            "{what}: the namespace in {} is not what was backed up:\n{}",
            to.name,
            differ.join("\n")
        );
        assert_eq!(crash::paused_clusters(to), Vec::<String>::new(), "{what}");
        crash::restored(to, &what);
        crash::shown(&format!(
            "{what}: passed in {:.1}s: {said}",
            t.elapsed().as_secs_f64()
        ));
    }
}

#[test]
fn a_run_takes_a_step_of_each_and_all_takes_every_step_both_ways() {
    let (b, r) = chosen(3, false);
    assert_eq!((b.len(), r.len()), (1, 1));
    let (b, r) = chosen(0, true);
    assert_eq!(b.len(), BACKUP_STEPS.len() * 2);
    assert_eq!(r.len(), RESTORE_STEPS.len() * 2);
    // Over as many runs as there are cases, each is taken.
    let taken: BTreeSet<_> = (0..14).map(|s| chosen(s, false).0[0].0).collect();
    assert_eq!(taken.len(), BACKUP_STEPS.len());
}
