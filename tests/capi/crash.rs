//! `handoff move` killed (SIGKILL, as `kill -9` or a laptop lid) at each of its crash points on
//! the real Cluster API (`../shared/capi`: the real clusterctl and the real core, kubeadm and
//! CAPD managers), then finished by the same command, or first undone by `--abort`.
//!
//! The crash points come from the code, as it runs: one uninterrupted move through the crash
//! proxies (`support::crash_proxy`) records every write handoff makes and labels it by what it
//! writes (`PATCH leases capd-system/controller-leader-election-capd in target`, `PUT
//! movewindows/status (Open, move Copying: took Lease ...) in target`, ...). A point is the first
//! write of each run of one label: each Lease, each record of the window, each standby, each
//! block-move, each release and restore. A wait lies between two writes, so killing before the
//! write after it is killing during the wait. Then clusterctl's own steps: its pause
//! of the source, its first and middle create in the target, its first delete from the source.
//! At a point the proxy kills handoff right before the write (clusterctl dies by its
//! PDEATHSIG); for clusterctl's, during it.
//!
//! After each kill: nobody writes through the proxies a second later (clusterctl died with
//! handoff); the phase the target's MoveWindow records is a row of the table "If a move stops"
//! (the test reads it), and the clusters are what that row says (nothing in the target before
//! `Copying`, the block-move on while the source is being stopped, both clusters' Leases the
//! window's while copying); and nothing is lost: every object is in the source or the target
//! with the same content (Secrets' data, the others' spec, by hash). Then the same command
//! finishes the move, or `--abort` first puts every controller back (refusing, as it must, once
//! clusterctl has begun deleting from the source; where it does not, what clusterctl copied to
//! the target stays paused) and the same command then moves; after which the namespace is in
//! the target alone, whole (the same objects and content, every owner reference resolving to
//! an object of that cluster), nothing marked `delete-for-move`, every provider of both
//! clusters leads again, and nothing of handoff is left.
//!
//! The cases, their groups and which of them a run takes are `crash_cases`'s: every run a case
//! of every group (a step of handoff's that writes, clusterctl's points, clusterctl dying
//! alone), each re-run or `--abort` killed in turn at a step of its own and then finished; the
//! run's cases in two halves, two tests on clusters of their own at the same time. Each case's
//! outcome is a line of every run's log (`[shown] case …`). The whole table, in shards that
//! resume from a ledger (docs/src/development.md):
//!
//! ```sh
//! HANDOFF_CRASH_CASES=all HANDOFF_CRASH_SHARD=0/4 HANDOFF_CRASH_LEDGER=$PWD/crash-ledger.txt HANDOFF_NETNS_RUN_LIMIT=36000 cargo test --test capi crash:: -- --nocapture
//! ```
//!
//! The managers lead-elect with 6 s leases here, not the shipped 15 s and 1 min: the points are
//! about handoff's order of writes, not about the bound, which `moves.rs` proves as shipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::apiserver::{eventually, skip, text};
use crate::support::capi::{BLOCK_MOVE, DELETE_FOR_MOVE, Mgmt, Rig, WINDOW_HOLDER};
use crate::support::crash_proxy::{Agent, CrashProxies, Cue, Trigger, Write};

use super::crash_cases::{self as cases, Case, CaseCount, Kill, RECOVERY, Then};
use super::crash_faults::{
    apiservers_restarted_mid_copy, handoff_down_in_a_window, pods_lost_and_added_in_a_window,
};
use super::crash_graph::fields_differing;
pub(super) use super::crash_graph::{Graph, differences, graph};

pub(super) const NS: &str = "ns1";
const WINDOW: &str = "move-ns1";

#[derive(Debug, Clone)]
struct Point {
    trigger: Trigger,
    /// Which write of the reference run it is (from 1), for the log.
    at: usize,
    /// The step of `handoff move` whose first write it is, if it is one.
    step: Option<String>,
    /// Its group (`crash_cases`): the step of handoff's it is in, or clusterctl's point.
    group: String,
}

impl Point {
    fn name(&self) -> String {
        let who = match self.trigger.agent {
            Agent::Handoff => "handoff",
            Agent::Clusterctl => "clusterctl",
        };
        let step = match &self.step {
            Some(s) => format!("step {s}'s first write: "),
            None => String::new(),
        };
        format!(
            "{step}write {} ({who}'s {} #{})",
            self.at, self.trigger.label, self.trigger.nth
        )
    }
}

/// The group of clusterctl's first and middle create in the target.
const CLUSTERCTL_CREATES: &str = "clusterctl's creates";

/// The crash points of one uninterrupted move's writes (see the header).
fn points(log: &[Write]) -> Vec<Point> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<(bool, String), usize> = BTreeMap::new();
    let mut previous: Option<(Agent, String)> = None;
    let mut run = 0;
    let mut clusterctl_creates = Vec::new();
    let mut first_clusterctl = true;
    let mut first_delete = true;
    // The steps of `handoff move` (its User-Agent names each): the first write of each is a
    // point, so a new step is a new point with no edit here.
    let mut steps_seen: BTreeSet<String> = BTreeSet::new();
    for (i, w) in log.iter().enumerate() {
        let is_handoff = w.agent == Agent::Handoff;
        let nth = {
            let n = seen.entry((is_handoff, w.label.clone())).or_default();
            *n += 1;
            *n
        };
        let same = previous.as_ref() == Some(&(w.agent, w.label.clone()));
        run = if same { run + 1 } else { 1 };
        previous = Some((w.agent, w.label.clone()));
        let first_of_step = w
            .step
            .as_ref()
            .filter(|s| steps_seen.insert(s.to_string()))
            .cloned();
        let point = |group: &str| Point {
            trigger: Trigger {
                agent: w.agent,
                label: w.label.clone(),
                nth,
            },
            at: i + 1,
            step: first_of_step.clone(),
            group: group.to_string(),
        };
        let step = w.step.as_deref().unwrap_or("no step");
        match w.agent {
            Agent::Handoff if run == 1 || first_of_step.is_some() => out.push(point(step)),
            Agent::Handoff => {}
            Agent::Clusterctl => {
                if first_clusterctl {
                    first_clusterctl = false;
                    out.push(point("clusterctl's pause"));
                }
                // Not the namespace: clusterctl creates it only where the target lacks it (the
                // first move into a cluster), and a move back finds it there.
                if w.label.starts_with("POST ")
                    && w.role == "target"
                    && !w.label.starts_with("POST namespaces")
                {
                    clusterctl_creates.push(point(CLUSTERCTL_CREATES));
                }
                if w.label.starts_with("DELETE ") && w.role == "source" && first_delete {
                    first_delete = false;
                    out.push(point("clusterctl's first delete"));
                }
            }
        }
    }
    if let Some(first) = clusterctl_creates.first() {
        out.push(first.clone());
    }
    if clusterctl_creates.len() > 2 {
        out.push(clusterctl_creates[clusterctl_creates.len() / 2].clone());
    }
    out.sort_by_key(|p| p.at);
    out.dedup_by_key(|p| p.at);
    out
}

/// The rows of the table "If a move stops" in docs/src/tasks/move.md: (phase, what to do).
fn readme_rows() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/tasks/move.md"),
    )
    .expect("docs/src/tasks/move.md");
    let start = readme
        .find("<!-- crash-points: checked by tests/capi/crash.rs -->")
        .expect("the crash-point table marker of docs/src/tasks/move.md");
    readme[start..]
        .lines()
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            // The phase is the first cell's code span: `` `Copying` `` or `` `none` (…) ``.
            let phase = cells[0].split('`').nth(1).unwrap_or(cells[0]);
            (phase.to_string(), cells.last().unwrap_or(&"").to_string())
        })
        .collect()
}

/// The phase the target's MoveWindow records, or `none` (no MoveWindow, or no phase in it).
/// Any other failure to read it fails the test: `none` is a row of the table itself, so a read
/// that failed for another reason would pass as one.
fn phase(to: &Mgmt) -> String {
    let out = to.kubectl(&[
        "get",
        "movewindow",
        WINDOW,
        "-o",
        "jsonpath={.status.move.phase}",
    ]);
    phase_of(&out, to.name)
}

fn phase_of(out: &std::process::Output, cluster: &str) -> String {
    if !out.status.success() {
        let why = text(&out.stderr);
        // No such window, or no MoveWindow CRD: where nothing of handoff is installed the
        // window brings the CRD along, and takes it away again.
        assert!(
            why.contains("(NotFound)") || why.contains("doesn't have a resource type"),
            "{cluster}: reading MoveWindow {WINDOW}'s phase: {why}"
        );
        return "none".into();
    }
    match text(&out.stdout).trim() {
        "" => "none".into(),
        p => p.to_string(),
    }
}

fn kubectl_output(code: i32, stdout: &str, stderr: &str) -> std::process::Output {
    use std::os::unix::process::ExitStatusExt as _;
    std::process::Output {
        status: std::process::ExitStatus::from_raw(code << 8),
        stdout: stdout.into(),
        stderr: stderr.into(),
    }
}

#[test]
fn phase_is_none_only_where_the_window_or_its_phase_is_missing() {
    assert_eq!(
        phase_of(&kubectl_output(0, "Copying", ""), "dst"),
        "Copying"
    );
    assert_eq!(phase_of(&kubectl_output(0, "", ""), "dst"), "none");
    let missing = "Error from server (NotFound): movewindows.handoff.dev \"move-ns1\" not found\n";
    assert_eq!(phase_of(&kubectl_output(1, "", missing), "dst"), "none");
    let no_crd = "error: the server doesn't have a resource type \"movewindow\"\n";
    assert_eq!(phase_of(&kubectl_output(1, "", no_crd), "dst"), "none");
}

#[test]
#[should_panic(
    expected = "dst: reading MoveWindow move-ns1's phase: The connection to the server 127.0.0.1:6443 was refused"
)]
fn phase_of_an_unreadable_window_is_an_error() {
    let refused = "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?\n";
    phase_of(&kubectl_output(1, "", refused), "dst");
}

fn marked_for_delete(m: &Mgmt) -> Vec<String> {
    m.move_objects(NS)
        .iter()
        .filter(|o| o["metadata"]["annotations"].get(DELETE_FOR_MOVE).is_some())
        .map(|o| format!("{} {}", o["kind"], o["metadata"]["name"]))
        .collect()
}

pub(super) fn paused_clusters(m: &Mgmt) -> Vec<String> {
    m.get(&["-n", NS, "clusters.cluster.x-k8s.io"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["spec"]["paused"] == true)
        .map(|c| c["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// After an accepted `--abort`: every copy clusterctl made in the target is paused or gone.
/// clusterctl creates a Cluster paused, as it was in the source, and unpauses it only as its
/// last step; the rest of a workload cluster's objects are reconciled only while their Cluster
/// is not paused (or they carry `cluster.x-k8s.io/paused`). A copy running in the target would
/// reconcile the same workload cluster as the source. Returns how many copies there are.
fn target_copies_held(to: &Mgmt, what: &str) -> usize {
    const PAUSED: &str = "cluster.x-k8s.io/paused";
    let objects = to.move_objects(NS);
    let name = |o: &serde_json::Value| o["metadata"]["name"].as_str().unwrap_or("").to_string();
    let kind = |o: &serde_json::Value| o["kind"].as_str().unwrap_or("").to_string();
    let annotated = |o: &serde_json::Value| o["metadata"]["annotations"].get(PAUSED).is_some();
    let paused: BTreeSet<String> = objects
        .iter()
        .filter(|o| kind(o) == "Cluster" && (o["spec"]["paused"] == true || annotated(o)))
        .map(name)
        .collect();
    let by_uid: BTreeMap<&str, &serde_json::Value> = objects
        .iter()
        .map(|o| (o["metadata"]["uid"].as_str().unwrap_or(""), o))
        .collect();
    // Held: paused itself, or its Cluster (by the cluster-name label, or up its owners) is.
    fn held(
        o: &serde_json::Value,
        paused: &BTreeSet<String>,
        by_uid: &BTreeMap<&str, &serde_json::Value>,
        depth: usize,
    ) -> bool {
        let own = |o: &serde_json::Value| {
            o["metadata"]["annotations"].get(PAUSED).is_some()
                || (o["kind"] == "Cluster"
                    && o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| paused.contains(n)))
                || o["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"]
                    .as_str()
                    .is_some_and(|n| paused.contains(n))
        };
        own(o)
            || (depth < 8
                && o["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| by_uid.get(r["uid"].as_str().unwrap_or("")))
                    .any(|owner| held(owner, paused, by_uid, depth + 1)))
    }
    let running: Vec<String> = objects
        .iter()
        .filter(|o| !matches!(kind(o).as_str(), "Secret" | "ConfigMap"))
        .filter(|o| !held(o, &paused, &by_uid, 0))
        .map(|o| format!("{} {}", kind(o), name(o)))
        .collect();
    assert!(
        running.is_empty(),
        "{what}: copies in {} that would reconcile: {running:?} (paused Clusters there: {paused:?})",
        to.name
    );
    objects.len()
}

pub(super) struct Run {
    pub ok: bool,
    /// handoff was killed.
    pub killed: bool,
    pub log: String,
    /// The cues that acted, and the write each acted at.
    pub acted: Vec<(String, Write)>,
}

/// `handoff move` from cluster `from` (0 or 1) to the other, through the proxies, with `cues`
/// armed; returns once it and its clusterctl are gone.
fn run_move(rig: &Rig, proxies: &CrashProxies, from: usize, extra: &[&str], cues: Vec<Cue>) -> Run {
    let mut cmd = rig.handoff_move(
        &proxies.kubeconfigs[from],
        &proxies.kubeconfigs[1 - from],
        NS,
    );
    cmd.args(extra);
    run_handoff(rig, proxies, from, cmd, cues)
}

/// `cmd` (a `handoff move` through the proxies, the move's source cluster `from`) with `cues`
/// armed; returns once it and its clusterctl are gone.
pub(super) fn run_handoff(
    rig: &Rig,
    proxies: &CrashProxies,
    from: usize,
    mut cmd: Command,
    cues: Vec<Cue>,
) -> Run {
    proxies.set_source(from);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // Armed before the first write: the pid is known once spawned, and nothing is written
    // before handoff has read both clusters.
    proxies.arm(None, 0);
    let child = cmd.spawn().expect("handoff move");
    let armed = format!("{cues:?}");
    proxies.arm_cues(cues, child.id() as i32);
    let out = child.wait_with_output().expect("handoff move");
    let log = text(&out.stdout) + &text(&out.stderr);
    proxies.disarm();
    let killed = proxies.fired();
    eventually(
        "clusterctl gone with handoff (PDEATHSIG)",
        Duration::from_secs(30),
        || (!clusterctl_running(rig)).then_some(()),
    );
    // Nobody writes through the proxies once handoff is dead but what clusterctl had under way
    // when it died with handoff (PDEATHSIG), a moment after the kill. A write a second later
    // is a clusterctl that outlived handoff and went on copying: the case would then pass as
    // "all in the target" with the copy done unsupervised.
    let late = proxies.late_writes();
    let unsupervised: Vec<String> = late
        .iter()
        .filter(|w| w.after > Duration::from_secs(1))
        .map(|w| {
            format!(
                "{:.3}s after: {:?} ({}) {}",
                w.after.as_secs_f64(),
                w.agent,
                w.user_agent,
                w.label
            )
        })
        .collect();
    assert!(
        unsupervised.is_empty(),
        "writes more than 1s after handoff was killed at {armed} (clusterctl should have died with it):\n{}\nhandoff's output:\n{log}",
        unsupervised.join("\n")
    );
    Run {
        ok: out.status.success(),
        killed,
        log,
        acted: proxies.acted(),
    }
}

/// A clusterctl of this test's: one in this network namespace (the `moves` suite runs its own
/// clusterctl at the same time, in another).
pub(crate) fn clusterctl_running(rig: &Rig) -> bool {
    let exe = rig.clusterctl();
    let netns = std::fs::read_link("/proc/self/ns/net").expect("this process's network namespace");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read_link(e.path().join("exe")).is_ok_and(|p| p == exe)
                && std::fs::read_link(e.path().join("ns/net")).is_ok_and(|n| n == netns)
        })
}

/// The namespace moved to `to` whole and gone from `from`; both clusters' controllers lead;
/// nothing of handoff left.
pub(super) fn moved(from: &Mgmt, to: &Mgmt, before: &Graph, what: &str) {
    let differ = differences(before, &graph(to));
    assert!(
        differ.is_empty(),
        "{what}: the namespace in {} is not what was moved:\n{}",
        to.name,
        differ.join("\n")
    );
    assert!(
        graph(from).is_empty(),
        "{what}: left in {}: {:?}",
        from.name,
        graph(from).keys()
    );
    assert_eq!(marked_for_delete(to), Vec::<String>::new(), "{what}");
    assert_eq!(paused_clusters(to), Vec::<String>::new(), "{what}");
    // Re-provisioned by the target's controllers: clusterctl moves nothing still provisioning,
    // and the next move starts from here.
    eventually(
        &format!("{what}: {NS}/wl1 re-provisioned in {}", to.name),
        Duration::from_secs(240),
        || to.provisioned(NS, "wl1", 2),
    );
    for m in [from, to] {
        restored(m, what);
    }
}

/// Every provider of `m` leads again, and nothing of handoff is left there.
pub(super) fn restored(m: &Mgmt, what: &str) {
    eventually(
        &format!("{what}: every provider of {} leads again", m.name),
        Duration::from_secs(60),
        || m.providers_lead().then_some(()),
    );
    m.nothing_of_handoff_left(NS);
}

/// Every provider Lease of both clusters the window's: the row of `phase` says both clusters'
/// controllers are stopped.
fn both_stopped(clusters: [&Mgmt; 2], phase: &str, what: &str) {
    for m in clusters {
        assert!(
            m.window_holds_every_provider_lease(),
            "{what}: phase {phase} is \"both clusters' controllers stopped\", but a provider Lease of {} is not the window's",
            m.name
        );
    }
}

/// Right after a kill: the clusters are what the row of `recorded` says ("If a move stops"),
/// and nothing is lost: every object that was there before is in the source or the target (or
/// both, as clusterctl left a copy it did not finish), with its content unchanged.
///
/// `copied_before`: what the target held when the killed run began. A move's first run
/// begins with nothing there; a re-run finds what the killed run's clusterctl copied (paused),
/// and records `Stopping target` again while it re-takes the target, so "nothing copied" is
/// "nothing copied by this run".
fn after_kill(
    from: &Mgmt,
    to: &Mgmt,
    before: &Graph,
    copied_before: &BTreeSet<(String, String)>,
    recorded: &str,
    what: &str,
) -> &'static str {
    let (s, t) = (graph(from), graph(to));
    let added: Vec<String> = s
        .keys()
        .map(|k| (from.name, k))
        .chain(t.keys().map(|k| (to.name, k)))
        .filter(|(_, k)| !before.contains_key(*k))
        .map(|(m, k)| format!("{m}: {k:?}"))
        .collect();
    assert!(
        added.is_empty(),
        "{what}: objects that were not there before: {added:?}"
    );
    let mut lost = Vec::new();
    for (k, b) in before {
        if !s.contains_key(k) && !t.contains_key(k) {
            lost.push(format!("{k:?}: in neither cluster"));
        }
        for (m, now) in [(from.name, s.get(k)), (to.name, t.get(k))] {
            if let Some(now) = now.filter(|now| now.hash != b.hash) {
                lost.push(format!(
                    "{k:?} in {m}: content {} before, {} now: {}",
                    b.hash,
                    now.hash,
                    fields_differing(&b.content, &now.content).join("; ")
                ));
            }
        }
    }
    assert!(
        lost.is_empty(),
        "{what} (phase {recorded}): the source and the target together no longer hold what was there:\n{}",
        lost.join("\n")
    );
    let ours = format!("{WINDOW_HOLDER}{WINDOW}");
    let clusters = |m: &Mgmt| -> Vec<(String, bool, Option<String>)> {
        m.get(&["-n", NS, "clusters.cluster.x-k8s.io"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    c["spec"]["paused"] == true,
                    c["metadata"]["annotations"][BLOCK_MOVE]
                        .as_str()
                        .map(str::to_string),
                )
            })
            .collect()
    };
    let source_clusters = clusters(from);
    match recorded {
        "none" | "Stopping target" | "Moving" | "Stopping source" => {
            // clusterctl creates nothing in the target before handoff's block-move is lifted,
            // which is after both clusters were proven stopped and `Copying` recorded.
            let new: Vec<&(String, String)> =
                t.keys().filter(|k| !copied_before.contains(*k)).collect();
            assert!(
                new.is_empty(),
                "{what}: phase {recorded} is \"nothing copied\", but the target holds {new:?} (and, from before this run, {copied_before:?}): clusterctl copied before both clusters were proven stopped"
            );
            match recorded {
                "none" | "Stopping target" => assert!(
                    source_clusters
                        .iter()
                        .all(|(_, paused, bm)| !paused && bm.is_none()),
                    "{what}: phase {recorded} is \"the source runs\" (clusterctl not started, no block-move yet), but the source's Clusters (name, paused, block-move): {source_clusters:?}"
                ),
                // Recorded before handoff puts its block-move on: where clusterctl has run
                // (paused a Cluster), the block-move holds it.
                "Moving" => assert!(
                    source_clusters
                        .iter()
                        .all(|(_, paused, bm)| !paused || bm.as_deref() == Some(&ours)),
                    "{what}: phase {recorded}: a source Cluster paused by clusterctl without handoff's block-move ({ours}) holding it (name, paused, block-move): {source_clusters:?}"
                ),
                _ => assert!(
                    !source_clusters.is_empty()
                        && source_clusters
                            .iter()
                            .all(|(_, _, bm)| bm.as_deref() == Some(&ours)),
                    "{what}: phase {recorded} is \"the block-move holds clusterctl\", but the source's Clusters (name, paused, block-move): {source_clusters:?}"
                ),
            }
        }
        "Copying" => {
            assert!(
                source_clusters.iter().all(|(_, paused, _)| *paused),
                "{what}: phase Copying with the source's Clusters running (name, paused, block-move): {source_clusters:?}"
            );
            both_stopped([from, to], recorded, what);
        }
        // Recorded done, removing what the windows brought along: every controller back.
        "Done" => {
            assert!(
                s.is_empty() && t.len() == before.len(),
                "{what}: phase Done is \"the namespace is in the target\", but the source holds {:?}",
                s.keys().collect::<Vec<_>>()
            );
            for m in [from, to] {
                assert!(
                    !m.window_holds_any_provider_lease(),
                    "{what}: phase Done is \"every controller runs\", but a provider Lease of {} is the window's",
                    m.name
                );
            }
        }
        "Restoring" => assert!(
            s.is_empty() && t.len() == before.len(),
            "{what}: phase Restoring is \"the namespace is in the target\", but the source holds {:?}",
            s.keys().collect::<Vec<_>>()
        ),
        // clusterctl's part failed: handoff lifted its block-move, and kept both clusters
        // stopped for the re-run or the --abort.
        "Failed" => {
            assert!(
                source_clusters.iter().all(|(_, _, bm)| bm.is_none()),
                "{what}: phase Failed with handoff's block-move still on (name, paused, block-move): {source_clusters:?}"
            );
            both_stopped([from, to], recorded, what);
        }
        // Only what holds whatever the --abort had brought back: nothing lost, nothing added.
        "Aborting" => {}
        other => panic!("{what}: phase {other}: no row of the table says what the clusters hold"),
    }
    match (s.is_empty(), t.is_empty()) {
        (false, true) => "all in the source",
        (true, false) => "all in the target",
        _ => "partly copied (clusterctl's unfinished move)",
    }
}

/// What the cases of one run share.
struct Suite<'a> {
    rig: &'a Rig,
    proxies: &'a CrashProxies,
    before: &'a Graph,
    rows: &'a [(String, String)],
    points: &'a [Point],
    /// clusterctl's first create in the target, where it dies alone.
    first_create: Trigger,
}

/// What one case met, for the run's log.
#[derive(Default)]
struct CaseOutcome {
    /// The phases recorded after each kill.
    phases: Vec<String>,
    /// The steps each kill landed in (`clusterctl` where it was at a write of its own).
    steps_killed: Vec<String>,
    said: String,
}

impl CaseOutcome {
    /// Where the kills of `run` landed.
    fn killed(&mut self, who: &str, run: &Run) {
        for (cue, w) in &run.acted {
            let step = w.step.clone().unwrap_or_else(|| "clusterctl".to_string());
            self.said
                .push_str(&format!("{who}: {cue} (in {step}: {}); ", w.label));
            if cue.starts_with("handoff") {
                self.steps_killed.push(step);
            }
        }
    }
}

/// One case (`crash_cases`): the first kill, the re-run or the `--abort` killed in turn at a
/// step of its own, then the same command until the namespace is in `to`, whole.
fn run_case(
    x: &Suite,
    case: &Case,
    [from, to]: [&Mgmt; 2],
    here: usize,
    what: &str,
) -> CaseOutcome {
    let mut out = CaseOutcome::default();
    // Every move here starts as the reference did, with no MoveWindow in either cluster (a
    // finished move's is history, kept).
    for m in [from, to] {
        m.delete_all_windows();
    }
    let cues = match case.kill {
        Kill::At(p) => vec![Cue::Handoff(x.points[p].trigger.clone())],
        Kill::ClusterctlAlone { in_fail } => {
            let mut cues = vec![Cue::ClusterctlAlone(x.first_create.clone())];
            if in_fail {
                cues.push(Cue::KthStep {
                    steps: vec!["Fail"],
                    k: 1,
                });
            }
            cues
        }
    };
    let t = Instant::now();
    let first = run_move(x.rig, x.proxies, here, &[], cues);
    out.said
        .push_str(&format!("{:.1}s; ", t.elapsed().as_secs_f64()));
    match case.kill {
        Kill::At(p) => assert!(
            first.killed && !first.ok,
            "{what}: the move never reached its crash point #{p} {}:\n{}",
            x.points[p].name(),
            first.log
        ),
        Kill::ClusterctlAlone { in_fail } => {
            assert!(
                !first.ok
                    && first
                        .acted
                        .first()
                        .is_some_and(|(c, _)| c.starts_with("clusterctl alone")),
                "{what}: clusterctl was not killed alone at its first create ({:?}):\n{}",
                first.acted,
                first.log
            );
            assert_eq!(
                first.killed, in_fail,
                "{what}: handoff killed in its Fail step ({:?}):\n{}",
                first.acted, first.log
            );
        }
    }
    out.killed("the move", &first);
    let deletes_begun = graph(from).len() < x.before.len() || !marked_for_delete(from).is_empty();
    let nothing = BTreeSet::new();
    let recorded = stopped(x, [from, to], &nothing, what, &first.log, &mut out);
    // Killed after the move was recorded done (while removing what it brought along):
    // the same command, and an --abort (nothing to undo), remove what is left.
    if recorded == "Done" {
        let args: &[&str] = match case.then {
            Then::Abort => &["--abort"],
            Then::Rerun => &[],
        };
        let again = run_move(x.rig, x.proxies, here, args, vec![]);
        assert!(
            again.ok && again.log.contains("was moved already"),
            "{what}: {args:?} after the move was recorded done:\n{}",
            again.log
        );
        moved(from, to, x.before, what);
        x.proxies.take_log();
        out.said.push_str("finished");
        return out;
    }
    let chain = || {
        vec![Cue::KthStep {
            steps: RECOVERY.to_vec(),
            k: case.chain,
        }]
    };
    if case.then == Then::Abort {
        let t = Instant::now();
        let copied: BTreeSet<_> = graph(to).into_keys().collect();
        let mut aborted = run_move(x.rig, x.proxies, here, &["--abort"], chain());
        if aborted.killed {
            out.killed("its --abort", &aborted);
            let what = format!("{what}, its --abort killed");
            stopped(x, [from, to], &copied, &what, &aborted.log, &mut out);
            aborted = run_move(x.rig, x.proxies, here, &["--abort"], vec![]);
        }
        aborted_as_it_must(from, to, &aborted, deletes_begun, what);
        out.said.push_str(match aborted.ok {
            true => "--abort undid it",
            false => "--abort refused: clusterctl had begun deleting",
        });
        out.said
            .push_str(&format!(" ({:.1}s); ", t.elapsed().as_secs_f64()));
    }
    let chained = match case.then {
        Then::Rerun => chain(),
        Then::Abort => vec![],
    };
    let t = Instant::now();
    let copied: BTreeSet<_> = graph(to).into_keys().collect();
    let mut rerun = run_move(x.rig, x.proxies, here, &[], chained);
    if rerun.killed {
        out.killed("its re-run", &rerun);
        let what = format!("{what}, its re-run killed");
        stopped(x, [from, to], &copied, &what, &rerun.log, &mut out);
        rerun = run_move(x.rig, x.proxies, here, &[], vec![]);
    }
    assert!(
        rerun.ok,
        "{what}: the same command again:\n{}\nthe killed run:\n{}",
        rerun.log, first.log
    );
    out.said
        .push_str(&format!("re-run {:.1}s; ", t.elapsed().as_secs_f64()));
    let t = Instant::now();
    moved(from, to, x.before, what);
    x.proxies.take_log();
    out.said.push_str(&format!(
        "finished, re-provisioned and checked in {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    out
}

/// Right after a kill: the phase recorded is a row of the book's table, and the clusters are
/// what that row says (`after_kill`).
fn stopped(
    x: &Suite,
    [from, to]: [&Mgmt; 2],
    copied_before: &BTreeSet<(String, String)>,
    what: &str,
    log: &str,
    out: &mut CaseOutcome,
) -> String {
    let recorded = phase(to);
    assert!(
        x.rows.iter().any(|(phase, _)| *phase == recorded),
        "{what}: phase {recorded} is no row of the table in docs/src/tasks/move.md {:?}\n{log}",
        x.rows
    );
    let state = after_kill(from, to, x.before, copied_before, &recorded, what);
    out.said.push_str(&format!("phase {recorded}, {state}; "));
    out.phases.push(recorded.clone());
    recorded
}

/// An `--abort` that ran to its end: accepted where clusterctl had not begun deleting from the
/// source (every controller back, what clusterctl copied to the target paused), refused where
/// it had.
fn aborted_as_it_must(from: &Mgmt, to: &Mgmt, aborted: &Run, deletes_begun: bool, what: &str) {
    if aborted.ok {
        let copies = target_copies_held(to, &format!("{what}, after --abort"));
        for m in [from, to] {
            restored(m, &format!("{what}, after --abort"));
        }
        // Checked again with every controller back: a paused copy stays paused.
        target_copies_held(to, &format!("{what}, after --abort, restored"));
        eprintln!("{what}: after --abort, {copies} copies in the target, all paused");
        // As --abort says: what clusterctl paused stays paused for the user to decide;
        // unpausing the source's lets it reconcile them again (and lets the move run).
        for name in paused_clusters(from) {
            assert!(aborted.log.contains(&name), "{what}: {}", aborted.log);
            from.ok(&[
                "-n",
                NS,
                "patch",
                "clusters.cluster.x-k8s.io",
                &name,
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"paused":false}}"#,
            ]);
        }
    } else {
        assert!(
            aborted.log.contains("begun deleting") || aborted.log.contains("had moved it"),
            "{what}: --abort failed:\n{}",
            aborted.log
        );
    }
    // Refused exactly where clusterctl had begun deleting from the source.
    assert_eq!(
        aborted.ok, !deletes_begun,
        "{what}: --abort with deletes begun: {deletes_begun}:\n{}",
        aborted.log
    );
}

/// Which of the table's cases run (`crash_cases`): `HANDOFF_CRASH_ONLY=4,17` those;
/// `HANDOFF_CRASH_CASES=all` every one (`HANDOFF_CRASH_SHARD=i/n` a shard of them, and those a
/// ledger does not say passed); else `HANDOFF_CRASH_CASES` of each group (1), the next ones in
/// turn for each commit and each day (`HANDOFF_CRASH_SEED`, by default the clone's number of
/// commits plus the day's number).
fn choose(groups: &[(String, Vec<usize>)], n: usize, half: usize, table_fp: &str) -> Vec<usize> {
    if let Ok(only) = std::env::var("HANDOFF_CRASH_ONLY") {
        let only = cases::only_cases(&only, n).unwrap_or_else(|e| panic!("{e}"));
        return cases::half(only, half);
    }
    let count = std::env::var("HANDOFF_CRASH_CASES").ok();
    let k = match cases::case_count(count.as_deref()).unwrap_or_else(|e| panic!("{e}")) {
        CaseCount::All => {
            let (i, of) = match std::env::var("HANDOFF_CRASH_SHARD") {
                Ok(v) => cases::shard(&v).unwrap_or_else(|e| panic!("{e}")),
                Err(_) => (0, 1),
            };
            let path = ledger().expect(
                "HANDOFF_CRASH_CASES=all needs HANDOFF_CRASH_LEDGER=FILE: the whole table takes hours, resumes from the cases it says passed, and is checked against the book's table once it holds them all",
            );
            let ledger = std::fs::read_to_string(&path).unwrap_or_default();
            let named = cases::ledger_is_for(&ledger, table_fp)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if !named {
                use std::io::Write as _;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                f.write_all(cases::ledger_table_line(table_fp).as_bytes())
                    .expect("the ledger's table line");
            }
            let (done, _) = cases::passed(&ledger);
            let chosen: Vec<usize> = (0..n)
                .filter(|c| c % of == i && !done.contains(c))
                .collect();
            let chosen = cases::half(chosen, half);
            shown(&format!(
                "crash cases, half {half}: shard {i}/{of} of the whole table ({n} cases), {} passed before, {} to run in this half",
                done.len(),
                chosen.len()
            ));
            return chosen;
        }
        CaseCount::PerGroup(k) => k,
    };
    let seed = seed();
    let chosen = cases::per_group(groups, k, seed);
    shown(&format!(
        "crash cases this run: {chosen:?} of {n}, {k} of each of {} groups, this half's: {:?} (HANDOFF_CRASH_SEED={seed}; HANDOFF_CRASH_ONLY={} for these again, HANDOFF_CRASH_CASES=all for every one)",
        groups.len(),
        cases::half(chosen.clone(), half),
        chosen
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",")
    ));
    cases::half(chosen, half)
}

/// `HANDOFF_CRASH_SEED`, by default the clone's number of commits plus the day's number: a
/// shallow clone (one commit) still turns, daily.
fn seed() -> usize {
    std::env::var("HANDOFF_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let commits: usize = Command::new("git")
                .args(["rev-list", "--count", "HEAD"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()
                .and_then(|out| text(&out.stdout).trim().parse().ok())
                .unwrap_or(0);
            commits + (support::capi::wall() / 86400.0) as usize
        })
}

/// `HANDOFF_CRASH_LEDGER`: the file each passed case is written to, and read from to resume.
fn ledger() -> Option<std::path::PathBuf> {
    std::env::var_os("HANDOFF_CRASH_LEDGER").map(Into::into)
}

/// A line for every run's log, passed or not (`support::netns::ALWAYS_SHOWN`).
pub(super) fn shown(line: &str) {
    use std::io::Write as _;
    // Past libtest's capture: the harness outside the network namespace passes it on as it is.
    let _ = writeln!(std::io::stderr(), "{}{line}", support::netns::ALWAYS_SHOWN);
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn handoff_move_killed_at_each_crash_point_is_finished_or_undone() {
    crash_suite(
        "crash::handoff_move_killed_at_each_crash_point_is_finished_or_undone",
        0,
    );
}

/// The other half of the run's cases, at the same time on clusters of its own (a case costs
/// 80 to 110 s: a run's fourteen on one pair of clusters would take 20 minutes), then an API
/// server restarted mid-copy, pods lost in a window and handoff down in one.
#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn handoff_move_killed_at_each_crash_point_other_half_and_what_else_can_happen() {
    crash_suite(
        "crash::handoff_move_killed_at_each_crash_point_other_half_and_what_else_can_happen",
        1,
    );
}

fn crash_suite(test_name: &str, half: usize) {
    if skip() || !support::netns::in_own_netns(test_name) {
        return;
    }
    let Some(rig) = Rig::find() else {
        return;
    };
    let t0 = Instant::now();
    let rows = readme_rows();
    assert!(
        rows.len() >= 5,
        "the crash-point table of docs/src/tasks/move.md: {rows:?}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let env = [
        ("LEASE_DURATION", "6s"),
        ("RENEW_DEADLINE", "4s"),
        ("RETRY_PERIOD", "1s"),
    ];
    let mut clusters = rig.up(dir.path(), &["src", "dst"], &env);
    let mut dst = clusters.pop().unwrap();
    let mut src = clusters.pop().unwrap();
    // Nothing of handoff installed: each window brings what it needs and takes it away, and
    // those writes are crash points too. (Installed, for `handoff_down_in_a_window` only.)
    let w = src.workload(&rig, NS, "wl1", 1);
    let out = w.wait_with_output().expect("workload.sh");
    assert!(out.status.success(), "workload: {}", text(&out.stderr));
    let before = graph(&src);
    let probes = support::capi::probe_objects(&src.workload_yaml(NS, "wl1"), "probe");
    assert!(before.len() >= 10, "{before:?}");
    let proxies = CrashProxies::start([&src.kubeconfig, &dst.kubeconfig], dir.path());
    let mgmt = [&src, &dst];
    eprintln!(
        "set up in {:.1}s; the namespace: {} objects",
        t0.elapsed().as_secs_f64(),
        before.len()
    );

    // The reference: one move, not interrupted, through the proxies.
    let t = Instant::now();
    let r = run_move(&rig, &proxies, 0, &[], vec![]);
    assert!(r.ok, "the reference move:\n{}", r.log);
    let log = proxies.take_log();
    moved(&src, &dst, &before, "the reference move");
    let agents: BTreeSet<Agent> = log.iter().map(|w| w.agent).collect();
    assert_eq!(agents.len(), 2, "the proxies tell handoff from clusterctl");
    // Every write of handoff's names the step that made it, and a move that writes goes
    // through the steps that write, in the order the planner gives them.
    let unnamed: Vec<&str> = log
        .iter()
        .filter(|w| w.agent == Agent::Handoff && w.step.is_none())
        .map(|w| w.label.as_str())
        .collect();
    assert!(unnamed.is_empty(), "writes of no step: {unnamed:?}");
    let mut steps: Vec<&str> = log.iter().filter_map(|w| w.step.as_deref()).collect();
    steps.dedup();
    assert_eq!(
        steps,
        [
            "StopTarget",
            "Hold",
            "StopSource",
            "ProveStopped",
            "Lift",
            "Copied",
            "RestoreTarget",
            "RestoreSource",
            "Finish",
            "Uninstall"
        ],
        "the steps that wrote, in order"
    );
    let points = points(&log);
    eprintln!(
        "reference move: {:.1}s, {} writes ({} handoff's), {} crash points:",
        t.elapsed().as_secs_f64(),
        log.len(),
        log.iter().filter(|w| w.agent == Agent::Handoff).count(),
        points.len()
    );
    for (i, p) in points.iter().enumerate() {
        eprintln!("  #{i}: {}", p.name());
    }
    let mut here = 1;
    let first_create = points
        .iter()
        .find(|p| p.group == CLUSTERCTL_CREATES)
        .map(|p| p.trigger.clone())
        .expect("clusterctl's first create in the target, in the reference move");
    let table = cases::table(points.len());
    let point_groups: Vec<String> = points.iter().map(|p| p.group.clone()).collect();
    let groups = cases::groups(&table, &point_groups);
    let x = Suite {
        rig: &rig,
        proxies: &proxies,
        before: &before,
        rows: &rows,
        points: &points,
        first_create,
    };
    let mut phases_seen = BTreeSet::new();
    let mut steps_killed = BTreeSet::new();
    let table_fp = cases::fingerprint(&point_groups, table.len());
    for c in choose(&groups, table.len(), half, &table_fp) {
        let group = &groups.iter().find(|(_, cs)| cs.contains(&c)).unwrap().0;
        let t = Instant::now();
        let what = format!(
            "case {c} [{group}]: {} → {}, {}",
            mgmt[here].name,
            mgmt[1 - here].name,
            table[c].describe()
        );
        let outcome = run_case(&x, &table[c], [mgmt[here], mgmt[1 - here]], here, &what);
        phases_seen.extend(outcome.phases.iter().cloned());
        steps_killed.extend(outcome.steps_killed.iter().cloned());
        let secs = t.elapsed().as_secs_f64();
        shown(&format!("{what}: passed in {secs:.1}s: {}", outcome.said));
        if let Some(path) = ledger() {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("HANDOFF_CRASH_LEDGER {}: {e}", path.display()));
            f.write_all(cases::ledger_line(c, secs, &outcome.phases, &outcome.said).as_bytes())
                .unwrap_or_else(|e| panic!("HANDOFF_CRASH_LEDGER {}: {e}", path.display()));
        }
        here = 1 - here;
    }
    shown(&format!(
        "crash cases: the phases met after a kill {phases_seen:?}; the steps killed in {steps_killed:?}"
    ));
    if let Some((cases, phases)) = ledger()
        .map(|p| cases::passed(&std::fs::read_to_string(p).unwrap_or_default()))
        .filter(|(cases, _)| cases.len() == table.len())
    {
        let rows: BTreeSet<String> = rows.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(
            phases,
            rows,
            "the table of docs/src/tasks/move.md and the phases the whole table's {} cases met",
            cases.len()
        );
        shown("crash cases: the whole table passed, and met every row of the book's table");
    }
    // A backup and a restore killed too, on the first half's clusters: every step both ways in
    // the whole table's first shard, none in its others, nor where the run names its cases
    // (`HANDOFF_CRASH_ONLY`, which names the move's).
    let all = std::env::var("HANDOFF_CRASH_CASES").as_deref() == Ok("all");
    let first_shard =
        std::env::var("HANDOFF_CRASH_SHARD").map_or(true, |s| s.trim().starts_with("0/"));
    if half == 0 && std::env::var("HANDOFF_CRASH_ONLY").is_err() && (!all || first_shard) {
        super::crash_directory::backup_and_restore_killed(
            &rig,
            &proxies,
            [mgmt[here], mgmt[1 - here]],
            here,
            &before,
            dir.path(),
            seed(),
            all,
        );
    }
    if half == 1 {
        apiservers_restarted_mid_copy(&rig, mgmt[here], mgmt[1 - here], &before);
        here = 1 - here;
        pods_lost_and_added_in_a_window(mgmt[here], probes);
        let m = if here == 0 { &mut src } else { &mut dst };
        m.register_handoff();
        handoff_down_in_a_window(m);
    }
    eprintln!("whole test {:.1}s", t0.elapsed().as_secs_f64());
}
