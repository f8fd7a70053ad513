//! What else can happen during a move, on the crash suite's clusters (`crash.rs`'s second
//! half, after its cases): both kube-apiservers restarted while clusterctl copies, a provider
//! pod deleted and a replica added in a window, and handoff's webhook down in a window. The
//! book's "If a move stops" lists each with what holds.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::apiserver::{eventually, text};
use crate::support::capi::{Mgmt, MovedObjects, Rig};

use super::crash::{Graph, NS, moved, restored};

/// `handoff window ARGS --kubeconfig` of `m`: whether it succeeded, and what it said.
fn handoff_window(m: &Mgmt, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .arg("window")
        .args(args)
        .arg("--kubeconfig")
        .arg(&m.kubeconfig)
        .env_remove("KUBECONFIG")
        .output()
        .expect("handoff window");
    (out.status.success(), text(&out.stdout) + &text(&out.stderr))
}

/// A provider pod deleted while its Lease is held, and a replica added to another provider
/// during the window: neither the replacement nor the new replica may lead until the window
/// closes (the Lease stays the window's over several lease durations), both become Ready, and
/// the webhooks they serve answer throughout.
pub(super) fn pods_lost_and_added_in_a_window(m: &Mgmt, probes: Vec<serde_json::Value>) {
    let window = "pods-in-a-window";
    let handoff = |args: &[&str]| {
        let (ok, log) = handoff_window(m, args);
        assert!(ok, "handoff window {args:?}:\n{log}");
        log
    };
    handoff(&["open", window]);
    let opened = support::capi::wall();
    assert!(
        m.window_holds_every_provider_lease(),
        "{}: the window holds every provider Lease",
        m.name
    );
    let _ = m.kubectl(&["create", "namespace", "probe"]);
    let prober =
        support::capi::Prober::start(vec![(m.name.to_string(), m.kubeconfig.clone(), probes)]);
    // One of CAPD's two Ready pods deleted (the other keeps its webhooks serving); the core
    // provider scaled 2 → 3.
    // The former leader's replacement comes up after `open` returns: its end, not the
    // replacement, is what `open` waits for.
    let capd = eventually(
        &format!(
            "{}: CAPD's standby and the former leader's replacement Ready",
            m.name
        ),
        Duration::from_secs(120),
        || Some(support::capi::ready_pod_names(m, "capd-system")).filter(|p| p.len() == 2),
    );
    m.ok(&[
        "-n",
        "capd-system",
        "delete",
        "pod",
        &capd[0],
        "--wait=false",
    ]);
    m.ok(&[
        "-n",
        "capi-system",
        "scale",
        "deployment",
        "capi-controller-manager",
        "--replicas=3",
    ]);
    let ready = |ns: &str| support::capi::ready_pod_names(m, ns);
    eventually(
        "CAPD's replacement pod and the core provider's third replica Ready",
        Duration::from_secs(90),
        || {
            let capd_now = ready("capd-system");
            (capd_now.len() >= 2 && !capd_now.contains(&capd[0]) && ready("capi-system").len() >= 3)
                .then_some(())
        },
    );
    // Several lease durations (6 s) with the new pods running: the Leases stay the window's.
    held_throughout(
        m,
        Duration::from_secs(20),
        "a provider took its Lease during the window",
    );
    let (ran, failed) = prober.finish();
    assert!(
        ran >= 10 && failed.is_empty(),
        "{ran} probes, failed: {failed:#?}"
    );
    // Each provider's log read (`lease_acquisitions` fails where one shows no acquisition).
    for a in m.lease_acquisitions() {
        assert!(
            a.at < opened,
            "{}: {} acquired its Lease in the window: {}",
            m.name,
            a.pod,
            a.line
        );
    }
    let closed = handoff(&["close", window]);
    // The count changed in the window stays (close says so); put back as shipped.
    m.ok(&[
        "-n",
        "capi-system",
        "scale",
        "deployment",
        "capi-controller-manager",
        "--replicas=1",
    ]);
    restored(m, "");
    eprintln!(
        "{}: pods lost and added in a window: Leases kept, {ran} webhook probes passed; close said:\n{closed}",
        m.name
    );
}

/// One cluster's provider Leases as read again and again (each a fresh list from its API
/// server), from during the copy until a read finds one that is not the window's: the restore
/// has begun (or a Lease was lost, which the caller tells apart by when). Reads the API server
/// does not answer, while it restarts, are skipped.
struct LeaseReads {
    /// When each read began and ended in which every provider Lease was the window's.
    held: Vec<(f64, f64)>,
    /// The first read in which one was not: when it began and ended, and the holders.
    released: Option<(f64, f64, Vec<String>)>,
}

impl LeaseReads {
    /// The window held the Leases across the copy, as far as these reads can tell: a read
    /// found them the window's after the API server was ready again (`ready`), and one begun
    /// after the latest the copy can have ended (`last_delete`, where a re-list first saw the
    /// last delete), before a read found them released. Taking the copy's earliest end instead
    /// would pass a Lease released while the source was down, before clusterctl's last delete.
    /// Times are said since `started`.
    fn held_across(&self, ready: f64, last_delete: f64, started: f64) -> Result<(), String> {
        let at = |t: f64| t - started;
        if !self.held.iter().any(|(began, _)| *began > ready) {
            return Err(format!(
                "no read found the Leases the window's after its kube-apiserver was ready again (+{:.1}s) and before a read found them released ({:?}); {} reads before",
                at(ready),
                self.released
                    .as_ref()
                    .map(|(_, ended, holders)| (at(*ended), holders)),
                self.held.len()
            ));
        }
        let Some((_, released, holders)) = &self.released else {
            return Err(format!(
                "no read found the provider Leases released ({} reads, all the window's)",
                self.held.len()
            ));
        };
        let held_after_copy = self.held.iter().any(|(began, _)| *began > last_delete);
        if *released <= last_delete || !held_after_copy {
            return Err(format!(
                "provider Leases not found the window's by any read begun after the copy ended at the latest (+{:.1}s), and found released at +{:.1}s: {holders:?}",
                at(last_delete),
                at(*released)
            ));
        }
        Ok(())
    }
}

/// `LeaseReads` of `m` on a thread; once `stop` is set it gives up a minute later (the move
/// has finished by then, so the window has released the Leases).
fn read_leases(
    m: &Mgmt,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<LeaseReads> {
    let kubeconfig = m.kubeconfig.clone();
    std::thread::spawn(move || {
        let mut reads = LeaseReads {
            held: Vec::new(),
            released: None,
        };
        let mut give_up = f64::INFINITY;
        while support::capi::wall() < give_up {
            if stop.load(std::sync::atomic::Ordering::Relaxed) && give_up.is_infinite() {
                give_up = support::capi::wall() + 60.0;
            }
            let began = support::capi::wall();
            let out = support::capi::kubectl(
                &kubeconfig,
                &["get", "leases", "-A", "-o", "json", "--request-timeout=2s"],
                None,
            );
            let ended = support::capi::wall();
            // A failed get still prints an empty List: only what the server answered.
            let answered = out
                .status
                .success()
                .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok())
                .flatten();
            if let Some(v) = answered {
                let not_held: Vec<String> = support::capi::PROVIDERS
                    .iter()
                    .filter_map(|(ns, _, lease)| {
                        let holder = v["items"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|l| {
                                l["metadata"]["namespace"] == *ns && l["metadata"]["name"] == *lease
                            })
                            .and_then(|l| l["spec"]["holderIdentity"].as_str())
                            .unwrap_or("");
                        (!holder.starts_with(support::capi::WINDOW_HOLDER))
                            .then(|| format!("{ns}/{lease}: {holder:?}"))
                    })
                    .collect();
                if !not_held.is_empty() {
                    reads.released = Some((began, ended, not_held));
                    break;
                }
                reads.held.push((began, ended));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        reads
    })
}

/// The target's kube-apiserver restarted while clusterctl creates there, then the source's:
/// clusterctl's own retries decide the copy, and the move finishes by itself or by the same
/// command. The copy is read from the clusters (every moved kind watched in both: the first
/// create in the target to the last delete in the source), and each restart must overlap it.
/// Every provider Lease of each cluster is read again and again until the window releases
/// them (the restore), with reads of each cluster after its own restart: none is anyone
/// else's before the copy ended, and no manager's log says it acquired its Lease during the
/// copy or while the reads found it the window's.
pub(super) fn apiservers_restarted_mid_copy(rig: &Rig, from: &Mgmt, to: &Mgmt, before: &Graph) {
    let what = format!(
        "{} → {} with both kube-apiservers restarted mid-copy",
        from.name, to.name
    );
    let command = || {
        let mut cmd = rig.handoff_move(&from.kubeconfig, &to.kubeconfig, NS);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    };
    for m in [from, to] {
        m.delete_all_windows();
    }
    let (source_objects, target_objects) =
        (MovedObjects::start(from, NS), MovedObjects::start(to, NS));
    eventually(
        &format!("{what}: every moved kind's watch listed, in both clusters"),
        Duration::from_secs(300),
        || (source_objects.listed() && target_objects.listed()).then_some(()),
    );
    let started = support::capi::wall();
    let child = command().spawn().expect("handoff move");
    let (copying, first) = eventually(
        &format!("{what}: clusterctl's first create in the target"),
        Duration::from_secs(180),
        || target_objects.first_created(started),
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (source_reads, target_reads) = (
        read_leases(from, stop.clone()),
        read_leases(to, stop.clone()),
    );
    // (killed, ready again, how long it was gone)
    let restart = |m: &Mgmt| {
        let killed = support::capi::wall();
        let gone = m.restart_apiserver(Duration::from_secs(1));
        (killed, support::capi::wall(), gone)
    };
    let target_restart = restart(to);
    let source_restart = restart(from);
    let out = child.wait_with_output().expect("handoff move");
    let mut log = text(&out.stdout) + &text(&out.stderr);
    let by_itself = out.status.success();
    if !by_itself {
        let again = command().output().expect("handoff move again");
        let again_log = text(&again.stdout) + &text(&again.stderr);
        assert!(
            again.status.success(),
            "{what}: the same command again:\n{again_log}\nthe first run:\n{log}"
        );
        log += &again_log;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let source_reads = source_reads.join().expect("the source's Lease reads");
    let target_reads = target_reads.join().expect("the target's Lease reads");
    let copy = support::capi::copy_seen(&target_objects, &source_objects, started);
    let ((first_create, _), (last_delete, last)) = (copy.first_create, copy.last_delete);
    // When the copy ended is known only within bounds where only the source's re-list after
    // its restart saw the last delete: after the watch's last delivery (`last_delete_since`),
    // before the re-list (`last_delete`, when it was seen). Each check takes the bound that
    // keeps it sound: the Leases must be found the window's by a read that began after the
    // latest the copy can have ended (a Lease released during the outage, before clusterctl's
    // real last delete, then fails), and the restarts must overlap the copy by its earliest.
    let copy_ended = copy.last_delete_since;
    assert!(
        first_create <= copying,
        "{what}: the first create at {first_create}, after {first} at {copying}"
    );
    let at = |t: f64| t - started;
    for (m, (killed, ready, _), reads) in [
        (to, target_restart, &target_reads),
        (from, source_restart, &source_reads),
    ] {
        assert!(
            killed < last_delete && ready > first_create,
            "{what}: {}'s kube-apiserver was gone +{:.1}s .. +{:.1}s, not during the copy (+{:.1}s {first} .. +{:.1}s {last})",
            m.name,
            at(killed),
            at(ready),
            at(first_create),
            at(last_delete)
        );
        reads
            .held_across(ready, last_delete, started)
            .unwrap_or_else(|why| panic!("{what}: {}: {why}\n{log}", m.name));
        // The Leases were the window's until the copy ended and at every read that found them so.
        let held_until = reads
            .held
            .last()
            .map_or(copy_ended, |(began, _)| began.max(copy_ended));
        for a in m.lease_acquisitions() {
            assert!(
                !(a.at >= first_create && a.at <= held_until),
                "{what}: {}: {} acquired its Lease at +{:.1}s, in the copy or while the window held it (+{:.1}s .. +{:.1}s): {}",
                m.name,
                a.pod,
                at(a.at),
                at(first_create),
                at(held_until),
                a.line
            );
        }
    }
    moved(from, to, before, &what);
    let reads_after =
        |r: &LeaseReads, ready: f64| r.held.iter().filter(|(b, _)| *b > ready).count();
    eprintln!(
        "{what}: the copy +{:.1}s .. +{:.1}s; the target's kube-apiserver gone +{:.1}s .. +{:.1}s ({:.1}s), the source's +{:.1}s .. +{:.1}s ({:.1}s); Lease reads all the window's until the restore: the target {} ({} after its restart), the source {} ({} after); the move finished {}",
        at(first_create),
        at(last_delete),
        at(target_restart.0),
        at(target_restart.1),
        target_restart.2.as_secs_f64(),
        at(source_restart.0),
        at(source_restart.1),
        source_restart.2.as_secs_f64(),
        target_reads.held.len(),
        reads_after(&target_reads, target_restart.1),
        source_reads.held.len(),
        reads_after(&source_reads, source_restart.1),
        if by_itself {
            "by itself"
        } else {
            "by the same command again"
        }
    );
}

/// handoff's webhook down while a window holds the providers' Leases (no admission policies
/// installed, as here): the Leases stay held (their 10-year duration keeps every candidate
/// waiting, and the fail-closed held-Lease guard refuses anyone's write to them, the admin's
/// included), `window close` cannot release them either and says what to do, and once the
/// webhook answers again the same close restores everything.
pub(super) fn handoff_down_in_a_window(m: &mut Mgmt) {
    let window = "handoff-down";
    let (ok, log) = handoff_window(m, &["open", window]);
    assert!(ok, "{log}");
    let opened = support::capi::wall();
    m.stop_handoff();
    held_throughout(
        m,
        Duration::from_secs(15),
        "a Lease was taken while handoff was down",
    );
    let patched = m.patch_lease(
        "capd-system",
        "controller-leader-election-capd",
        r#"{"spec":{"holderIdentity":"someone-else"}}"#,
    );
    let why = text(&patched.stderr);
    assert!(
        !patched.status.success() && why.contains("lease-hold.handoff.dev"),
        "{}: a held Lease written while handoff was down: {why}",
        m.name
    );
    let (ok, log) = handoff_window(m, &["close", window]);
    assert!(
        !ok && log.contains("handoff's webhook is not answering")
            && log.contains("run the same command again"),
        "{}: close while handoff is down:\n{log}",
        m.name
    );
    assert!(
        m.window_holds_every_provider_lease(),
        "{}: the Leases after the refused close",
        m.name
    );
    for a in m.lease_acquisitions() {
        assert!(
            a.at < opened,
            "{}: {} acquired its Lease while handoff was down: {}",
            m.name,
            a.pod,
            a.line
        );
    }
    m.register_handoff();
    let (ok, again) = handoff_window(m, &["close", window]);
    assert!(ok, "{}: close once handoff answers again:\n{again}", m.name);
    restored(m, "");
    eprintln!(
        "{}: handoff down in a window: Leases held 15 s and more, the admin's write refused, close refused with:\n{log}",
        m.name
    );
}

/// Every provider Lease of `m` the window's at each read for `long` (several lease durations:
/// a candidate that could take one would have by then); `why` names what a failure means.
fn held_throughout(m: &Mgmt, long: Duration, why: &str) {
    let until = Instant::now() + long;
    while Instant::now() < until {
        assert!(m.window_holds_every_provider_lease(), "{}: {why}", m.name);
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The restart case's bound: the source's last delete happened while its API server was down
/// (+30 s .. +32 s), seen by the watch's last delivery at +30 s and by the re-list at +32 s. A
/// target Lease released at +31.5 s, maybe before clusterctl's real last delete, fails; by the
/// copy's earliest end (+30 s), as the check once took it, it passed.
#[test]
fn a_lease_released_while_the_source_was_down_fails_the_restart_case() {
    let (ready, since, last_delete) = (20.0, 30.0, 32.0);
    let reads = |held: &[f64], released: f64| LeaseReads {
        held: held.iter().map(|b| (*b, b + 0.1)).collect(),
        released: Some((
            released - 0.1,
            released,
            vec!["capi-system/x: \"pod\"".into()],
        )),
    };
    let released_in_outage = reads(&[18.0, 21.0, 30.5, 31.0], 31.5);
    assert!(released_in_outage.held_across(ready, since, 0.0).is_ok());
    let why = released_in_outage
        .held_across(ready, last_delete, 0.0)
        .unwrap_err();
    assert!(why.contains("found released at +31.5s"), "{why}");
    // Held until after the re-list saw the last delete: the restore, in time.
    assert_eq!(
        reads(&[18.0, 21.0, 31.0, 32.5, 33.0], 34.0).held_across(ready, last_delete, 0.0),
        Ok(())
    );
    // No read after the restart: nothing says the Leases survived it.
    let why = reads(&[18.0, 19.5], 34.0)
        .held_across(ready, last_delete, 0.0)
        .unwrap_err();
    assert!(
        why.contains("after its kube-apiserver was ready again"),
        "{why}"
    );
}
