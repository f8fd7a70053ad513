//! `handoff move` around a clusterctl stand-in that follows mover.go
//! (`tests/support/clusterctl_standin.py`), against two real kube-apiservers with Cluster API
//! providers from `../shared/provider-standin`: core (Lease, fail-closed webhook for
//! Clusters), Docker (Lease, marks its DockerClusters with block-move while their Cluster runs)
//! and a bootstrap provider without leader election (Scale), in a network namespace of the
//! test's own.
//!
//! `tests/capi/moves.rs` runs the real clusterctl and the real providers; this test keeps the
//! stand-ins for what they cannot do on cue: a clusterctl that fails after exactly N creates
//! or N deletes, a copy slowed to seconds per object, and providers that count their
//! reconciles (so a reconcile during the copy is seen, not inferred).
//!
//! Proves: the move completes; no controller of either cluster reconciles between the start
//! and the end of the copy; every write of the copy passes the providers' fail-closed webhooks;
//! the Docker provider lifts its own block-move after the pause; the target's controllers lead
//! again before the source's; a move that fails halfway leaves both clusters stopped, and
//! running it again finishes it; `--abort` restores; nothing of handoff is left.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use serde_json::Value;
use support::apiserver::{ADMIN, eventually, skip, text};
use support::mgmt::{CLUSTER_WEBHOOK, Mgmt, WAIT};
use support::providers::{
    DOCKERCLUSTERS, LeaseTiming, LeaseWatch, ProviderSpec, cluster, docker_cluster, led_first,
};

const HELD_BY: &str = "handoff.dev/held-by-window";
const BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";
const SAVED: &str = "handoff.dev/replicas-before-move";

fn providers(with_bootstrap: bool, ip: [u8; 4]) -> Vec<ProviderSpec> {
    let mut v = vec![
        ProviderSpec::capi_core()
            .replicas(2)
            .lease(LeaseTiming::FAST)
            .webhook_service("capi-webhook-service", ip.into()),
        ProviderSpec::new(
            "capd-system",
            "capd-controller-manager",
            "infrastructure-docker",
        )
        .leader_election(Some("controller-leader-election-capd"))
        .lease(LeaseTiming::FAST)
        .block_move(DOCKERCLUSTERS),
    ];
    if with_bootstrap {
        v.push(
            ProviderSpec::new(
                "capi-kubeadm-bootstrap-system",
                "capi-kubeadm-bootstrap-controller-manager",
                "bootstrap-kubeadm",
            )
            .leader_election(None),
        );
    }
    v
}

/// A workload cluster to move: a Cluster and its DockerCluster (owned by it).
fn workload(m: &Mgmt, ns: &str) {
    m.api.ok(ADMIN, &["create", "namespace", ns]);
    let out = m.api.kubectl_stdin(
        ADMIN,
        &["create", "-f", "-"],
        Some(&cluster(ns, "workload", false)),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let uid = m.get(&["-n", ns, "clusters.cluster.x-k8s.io", "workload"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let mut dc: Value = serde_json::from_str(&docker_cluster(ns, "workload")).expect("json");
    dc["metadata"]["ownerReferences"] = serde_json::json!([{
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "workload", "uid": uid
    }]);
    let out = m
        .api
        .kubectl_stdin(ADMIN, &["create", "-f", "-"], Some(&dc.to_string()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The Docker provider marks it while its Cluster runs.
    eventually("the Docker provider's block-move", WAIT, || {
        m.get(&[
            "-n",
            ns,
            "dockerclusters.infrastructure.cluster.x-k8s.io",
            "workload",
        ])["metadata"]["annotations"]
            .get(BLOCK_MOVE)
            .map(|_| ())
    });
}

/// The provider Leases of `m` (`namespace/name`), each with the Deployment whose pods lead it.
fn provider_leases(m: &Mgmt) -> Vec<(String, String)> {
    m.providers
        .iter()
        .filter(|p| p.spec.leader_election_id.is_some())
        .map(|p| {
            (
                format!("{}/{}", p.namespace(), p.lease_name()),
                p.name().to_string(),
            )
        })
        .collect()
}

/// Every write of `m`'s Leases from now on.
fn watch_leases(m: &Mgmt) -> LeaseWatch {
    let keys: Vec<String> = provider_leases(m).into_iter().map(|(k, _)| k).collect();
    LeaseWatch::start(&m.api, m.label, &keys)
}

/// The holder identity of the window handoff move opens for namespace `ns`.
fn window_holder(ns: &str) -> String {
    format!("handoff.dev/move-window/move-{ns}")
}

fn standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/clusterctl_standin.py")
}

/// `handoff move` as the operator, with `env` for the clusterctl stand-in.
fn handoff_move(
    source: &Mgmt,
    target: &Mgmt,
    ns: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> Output {
    move_command(source, target, ns, extra, env)
        .output()
        .expect("handoff move")
}

fn move_command(
    source: &Mgmt,
    target: &Mgmt,
    ns: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> Command {
    move_command_with(source, target, ns, &standin(), extra, env)
}

fn move_command_with(
    source: &Mgmt,
    target: &Mgmt,
    ns: &str,
    clusterctl: &Path,
    extra: &[&str],
    env: &[(&str, String)],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
    cmd.arg("move")
        .arg("--kubeconfig")
        .arg(source.operator_kubeconfig())
        .arg("--to-kubeconfig")
        .arg(target.operator_kubeconfig())
        .args(["--namespace", ns])
        .arg("--clusterctl")
        .arg(clusterctl)
        .args(extra)
        .env_remove("KUBECONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn event<'a>(records: &'a [Value], name: &str) -> &'a Value {
    records
        .iter()
        .rev()
        .find(|r| r["event"] == name)
        .unwrap_or_else(|| panic!("no {name} in {records:?}"))
}

/// Nothing of handoff is left in this cluster: no Lease held, no saved count, no block-move of
/// handoff's, every window closed.
fn nothing_left(m: &Mgmt, ns: &str) {
    let held = m
        .api
        .ok(ADMIN, &["get", "leases", "-A", "-l", HELD_BY, "-o", "name"]);
    assert!(
        held.trim().is_empty(),
        "{}: Leases still held: {held}",
        m.label
    );
    let deps = m.get(&["deployments", "-A"]);
    for d in deps["items"].as_array().unwrap() {
        assert!(
            d["metadata"]["annotations"].get(SAVED).is_none(),
            "{}: {} keeps a saved count",
            m.label,
            d["metadata"]["name"]
        );
    }
    for w in m.get(&["movewindows"])["items"].as_array().unwrap() {
        assert_eq!(w["spec"]["state"], "Closed", "{}: {w}", m.label);
    }
    for c in m.get(&["mutatingwebhookconfigurations"])["items"]
        .as_array()
        .unwrap()
    {
        let name = c["metadata"]["name"].as_str().unwrap_or("");
        assert!(
            !name.starts_with("handoff-window-"),
            "{}: {name} outlived its window",
            m.label
        );
    }
    // Every standby gone: each provider at its own count.
    for p in &m.providers {
        assert_eq!(
            m.replicas(p.namespace(), p.name()),
            i64::from(p.spec.replicas),
            "{}: {}",
            m.label,
            p.name()
        );
    }
    if m.exists(&["-n", ns, "clusters.cluster.x-k8s.io", "workload"]) {
        let c = m.get(&["-n", ns, "clusters.cluster.x-k8s.io", "workload"]);
        let block = c["metadata"]["annotations"][BLOCK_MOVE]
            .as_str()
            .unwrap_or("");
        assert!(!block.starts_with("handoff.dev/"), "{}: {c}", m.label);
    }
}

/// While stopped: every Lease-stopped provider's Lease is held by the window (a
/// single-replica one with a standby beside its pod), the Scale one at 0.
fn stopped(m: &Mgmt, window: &str) {
    for p in m
        .providers
        .iter()
        .filter(|p| p.spec.leader_election_id.is_some())
    {
        let lease = m.get(&["-n", p.namespace(), "lease", p.lease_name()]);
        assert_eq!(
            lease["metadata"]["labels"][HELD_BY], window,
            "{}: {lease}",
            m.label
        );
        let with_standby = match p.spec.replicas {
            1 => 2,
            n => i64::from(n),
        };
        assert_eq!(
            m.replicas(p.namespace(), p.name()),
            with_standby,
            "{}",
            p.name()
        );
    }
    for p in m
        .providers
        .iter()
        .filter(|p| p.spec.leader_election_id.is_none())
    {
        assert_eq!(m.replicas(p.namespace(), p.name()), 0, "{}", p.name());
    }
}

/// One step's headline, and its whole output only under `HANDOFF_TEST_LOGS=1`: libtest prints
/// a failed test's output before its panic, and a CI excerpt that shows the first lines of it
/// should reach the panic's `file:line` (every assertion carries the log it judged).
fn say(headline: &str, log: &str) {
    match std::env::var("HANDOFF_TEST_LOGS").is_ok_and(|v| v == "1") {
        true => eprintln!("{headline}:\n{log}"),
        false => eprintln!("{headline}: {} lines of output", log.lines().count()),
    }
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn handoff_move_stops_both_clusters_for_the_copy_and_finds_its_way_back() {
    if skip()
        || !support::netns::in_own_netns(
            "handoff_move_stops_both_clusters_for_the_copy_and_finds_its_way_back",
        )
    {
        return;
    }
    let started = Instant::now();
    let source = Mgmt::start("source", providers(true, [10, 0, 0, 20]));
    let target = Mgmt::start("target", providers(false, [10, 0, 0, 21]));
    workload(&source, "alpha");
    workload(&source, "beta");
    workload(&source, "gamma");
    workload(&source, "delta");
    eprintln!("set up in {:.1}s", started.elapsed().as_secs_f64());
    let dir = tempfile::tempdir().expect("temp dir");
    let rec = dir.path().join("clusterctl.jsonl");
    let env = |fail: Option<u32>| {
        let mut v = vec![
            ("CLUSTERCTL_STANDIN_RECORD", rec.display().to_string()),
            ("CLUSTERCTL_STANDIN_CREATE_DELAY", "1.5".to_string()),
        ];
        if let Some(n) = fail {
            v.push(("CLUSTERCTL_STANDIN_FAIL_AFTER_CREATES", n.to_string()));
        }
        v
    };

    // --dry-run: handoff's plan and clusterctl's dry run; nothing written.
    let dry = handoff_move(&source, &target, "alpha", &["--dry-run"], &env(None));
    let log = text(&dry.stderr) + &text(&dry.stdout);
    assert!(dry.status.success(), "{log}");
    assert!(
        log.contains("would create MoveWindow move-alpha")
            && log.contains("Lease: would hold controller-leader-election-capi")
            && log.contains("Scale: would pin to 0 replicas")
            && log.contains("Dry run: nothing was written"),
        "{log}"
    );
    // The stand-ins' Leases last 4 s (`LeaseTiming::FAST`): no proof is expected later.
    assert!(
        log.lines().any(|l| l.contains("then lift handoff's")
            && l.contains("expected within 4s of the source's stop")
            && l.contains("4s at the latest")),
        "{log}"
    );
    assert!(
        !source.exists(&["movewindow", "move-alpha"])
            && !target.exists(&["movewindow", "move-alpha"])
    );

    let _ = std::fs::remove_file(&rec);

    // A clusterctl older than its block-move wait (v1.6) is refused before anything is
    // written: nothing would hold its copy until both clusters are proven stopped.
    let old = dir.path().join("clusterctl-v1.5");
    std::fs::write(&old, "#!/bin/sh\necho v1.5.3\n").expect("old clusterctl");
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let refused = move_command_with(&source, &target, "alpha", &old, &[], &env(None))
        .output()
        .expect("handoff move");
    let log = text(&refused.stderr) + &text(&refused.stdout);
    assert!(!refused.status.success(), "{log}");
    assert!(
        log.contains("clusterctl v1.5.3 is older than v1.6"),
        "{log}"
    );
    assert!(
        !source.exists(&["movewindow", "move-alpha"])
            && !target.exists(&["movewindow", "move-alpha"]),
        "{log}"
    );

    // Who leads each provider Lease, as the clusters record it, from before the first move.
    let (source_leases, target_leases) = (watch_leases(&source), watch_leases(&target));

    // 1. A move that fails halfway (after the first create in the target).
    let t = Instant::now();
    let failed = handoff_move(&source, &target, "alpha", &[], &env(Some(1)));
    let log = text(&failed.stderr) + &text(&failed.stdout);
    say(
        &format!("a failing handoff move ({:.1}s)", t.elapsed().as_secs_f64()),
        &log,
    );
    assert!(!failed.status.success(), "{log}");
    for want in [
        "injected failure",
        "The controllers handoff stopped stay stopped",
        "finish the move: handoff move",
        "--abort",
        "source Clusters it paused",
    ] {
        assert!(log.contains(want), "{want:?} missing:\n{log}");
    }
    stopped(&source, "move-alpha");
    stopped(&target, "move-alpha");
    let c = source.get(&["-n", "alpha", "clusters.cluster.x-k8s.io", "workload"]);
    assert_eq!(c["spec"]["paused"], true, "clusterctl paused it: {c}");
    assert!(
        c["metadata"]["annotations"].get(BLOCK_MOVE).is_none(),
        "{c}"
    );
    assert!(target.exists(&["-n", "alpha", "clusters.cluster.x-k8s.io", "workload"]));
    let w = target.get(&["movewindow", "move-alpha"]);
    assert_eq!(w["status"]["move"]["phase"], "Failed", "{w}");
    assert_eq!(
        w["status"]["move"]["pausedByClusterctl"][0], "alpha/workload",
        "{w}"
    );

    // 2. The same command again finishes it; with -o json, its steps as events on standard
    // output, one JSON object a line (clusterctl's output on standard error).
    let t = Instant::now();
    let done = handoff_move(&source, &target, "alpha", &["-o", "json"], &env(None));
    let took = t.elapsed();
    let events: Vec<Value> = text(&done.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "step" && e["of"] == "move")
        .filter_map(|e| e["step"].as_str())
        .collect();
    let log = events
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    say(
        &format!(
            "handoff move again ({:.1}s), steps {steps:?}",
            took.as_secs_f64()
        ),
        &format!("{log}\n{}", text(&done.stderr)),
    );
    assert!(done.status.success(), "{log}");
    assert_eq!(
        steps,
        [
            "Begin",
            "Check",
            "PutSourceBack",
            "StopTarget",
            "Hold",
            "StartClusterctl",
            "AwaitPause",
            "StopSource",
            "ProveStopped",
            "Lift",
            "AwaitClusterctl",
            "ClusterctlExited",
            "Lift",
            "Copied",
            "RestoreTarget",
            "RestoreSource",
            "Finish",
            "Uninstall",
            "Done"
        ],
        "{log}"
    );
    for want in [
        "resuming the move recorded in MoveWindow move-alpha",
        "source: unpaused Cluster alpha/workload (clusterctl paused it)",
        "stopping the source's controllers",
        "lifted handoff's clusterctl.cluster.x-k8s.io/block-move from Cluster alpha/workload",
        "namespace alpha moved",
    ] {
        assert!(log.contains(want), "{want:?} missing:\n{log}");
    }
    // The target's controllers lead again before the source's: every target Lease is taken by
    // a provider pod (its acquireTime) before any source Lease is.
    let holder = window_holder("alpha");
    led_first(
        &target_leases.led_again(&holder, &provider_leases(&target), WAIT),
        &source_leases.led_again(&holder, &provider_leases(&source), WAIT),
        "the target's controllers lead again first",
    );
    // clusterctl's view, on the first attempt: the Docker provider's block-move was there at
    // discovery, and clusterctl waited until the provider itself lifted it, after the pause,
    // with its controllers still running. (On the re-run the provider marks its DockerCluster
    // again once its Cluster is unpaused, maybe after clusterctl's discovery: then handoff's
    // own wait covers it.) handoff's block-move on the Cluster was seen every time.
    let r = records(&rec);
    let first_blocking = r
        .iter()
        .find(|e| e["event"] == "discovered")
        .map(|e| e["blocking"].clone())
        .unwrap();
    assert!(
        first_blocking
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "DockerCluster workload"),
        "{first_blocking}"
    );
    assert!(
        r.iter()
            .any(|e| e["event"] == "unblocked" && e["object"] == "DockerCluster workload"),
        "{r:?}"
    );
    for d in r.iter().filter(|e| e["event"] == "discovered") {
        assert!(
            d["blocking"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b == "Cluster workload"),
            "handoff's block-move was seen at discovery: {d}"
        );
    }
    // No controller of either cluster reconciled between the start and the end of the copy.
    let (start, end) = (event(&r, "copy-start"), event(&r, "copy-end"));
    assert_eq!(
        start["reconciles"], end["reconciles"],
        "reconciled during the copy"
    );
    assert!(end["t"].as_f64().unwrap() - start["t"].as_f64().unwrap() >= 2.0);
    // Nothing handoff's was copied.
    for created in r.iter().filter(|e| e["event"] == "created") {
        let ann = &created["annotations"];
        let block = ann[BLOCK_MOVE].as_str().unwrap_or("");
        assert!(!block.starts_with("handoff.dev/"), "{created}");
    }
    // The move: in the target, gone from the source, and the target's Cluster running.
    let moved = target.get(&["-n", "alpha", "clusters.cluster.x-k8s.io", "workload"]);
    assert_eq!(moved["spec"]["paused"], false, "{moved}");
    assert!(target.exists(&[
        "-n",
        "alpha",
        "dockerclusters.infrastructure.cluster.x-k8s.io",
        "workload"
    ]));
    eventually("the source's copies deleted", WAIT, || {
        (!source.exists(&["-n", "alpha", "clusters.cluster.x-k8s.io", "workload"])).then_some(())
    });
    // Every write of the move (pause and deletes in the source, creates and unpause in the
    // target) had to pass Cluster API core's webhook of the cluster written to: registered
    // there for every write to a Cluster, failing closed, served only by the provider's pods
    // through its Service. The move succeeded, so each call was answered. (Its request
    // counters cannot show it: a replica that loses its Lease restarts from 0.)
    for m in [&source, &target] {
        let vwc = m.get(&["validatingwebhookconfiguration", CLUSTER_WEBHOOK]);
        let hook = &vwc["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail", "{vwc}");
        assert_eq!(
            hook["clientConfig"]["service"]["name"], "capi-webhook-service",
            "{vwc}"
        );
        assert!(hook["clientConfig"].get("url").is_none(), "{vwc}");
        assert_eq!(
            hook["rules"][0]["resources"],
            serde_json::json!(["clusters"])
        );
        assert_eq!(
            hook["rules"][0]["operations"],
            serde_json::json!(["CREATE", "UPDATE", "DELETE"])
        );
        nothing_left(m, "alpha");
        for p in &m.providers {
            m.rising(p);
        }
    }

    // 3. A move that just works, start to end (its phases are BENCHMARKS.md's figures).
    let t = Instant::now();
    let plain = handoff_move(&source, &target, "gamma", &[], &env(None));
    let took_plain = t.elapsed();
    let log = text(&plain.stderr);
    say(
        &format!("a plain handoff move ({:.1}s)", took_plain.as_secs_f64()),
        &log,
    );
    assert!(plain.status.success(), "{log}");
    assert!(
        !log.contains("resuming") && log.contains("namespace gamma moved"),
        "{log}"
    );
    assert!(target.exists(&["-n", "gamma", "clusters.cluster.x-k8s.io", "workload"]));
    for m in [&source, &target] {
        nothing_left(m, "gamma");
    }

    // 4. A move that fails once clusterctl has begun deleting from the source: restarting the
    // source's controllers then would re-create what was deleted, so the re-run keeps the
    // source stopped and lets clusterctl finish.
    let mut fail_deletes = env(None);
    fail_deletes.push(("CLUSTERCTL_STANDIN_FAIL_AFTER_DELETES", "1".into()));
    // Right after the move of gamma, whose source Leases were released and not waited for:
    // this move must wait for a candidate to hold each one, not take them for no Lease.
    let failed = handoff_move(&source, &target, "delta", &[], &fail_deletes);
    let log = text(&failed.stderr);
    say("a move that fails after clusterctl's first delete", &log);
    assert!(!failed.status.success(), "{log}");
    assert!(
        log.contains("injected failure")
            && log.contains("The controllers handoff stopped stay stopped"),
        "it failed for another reason than clusterctl's:\n{log}"
    );
    stopped(&source, "move-delta");
    stopped(&target, "move-delta");
    let held = source.capi().reconciles(&source.api);
    // clusterctl marks an object, then deletes it; one it marked and died before deleting keeps
    // the mark, and clusterctl copies annotations as they are: the re-run must unmark it first,
    // or its copy in the target is marked for deletion-by-move.
    source.api.ok(
        ADMIN,
        &[
            "-n",
            "delta",
            "annotate",
            "clusters.cluster.x-k8s.io",
            "workload",
            "clusterctl.cluster.x-k8s.io/delete-for-move=",
        ],
    );
    let finish = handoff_move(&source, &target, "delta", &[], &env(None));
    let log = text(&finish.stderr);
    say("handoff move after deletes had begun", &log);
    assert!(finish.status.success(), "{log}");
    assert!(
        log.contains("source: removed clusterctl.cluster.x-k8s.io/delete-for-move from Cluster delta/workload"),
        "{log}"
    );
    let copy = target.get(&["-n", "delta", "clusters.cluster.x-k8s.io", "workload"]);
    assert!(
        copy["metadata"]["annotations"]
            .get("clusterctl.cluster.x-k8s.io/delete-for-move")
            .is_none(),
        "the target's copy is marked for deletion-by-move: {copy}"
    );
    assert!(
        log.contains("clusterctl had begun deleting from the source, so the source's controllers stay stopped")
            && !log.contains("the source runs again"),
        "{log}"
    );
    let r = records(&rec);
    assert_eq!(
        event(&r, "copy-start")["reconciles"]["source"]["capi-system/controller-leader-election-capi-reconciles"],
        serde_json::json!(held),
        "the source reconciled before the copy finished"
    );
    assert!(target.exists(&[
        "-n",
        "delta",
        "dockerclusters.infrastructure.cluster.x-k8s.io",
        "workload"
    ]));
    eventually("delta gone from the source", WAIT, || {
        (!source.exists(&["-n", "delta", "clusters.cluster.x-k8s.io", "workload"])).then_some(())
    });
    for m in [&source, &target] {
        nothing_left(m, "delta");
    }

    // 5. A move interrupted during the copy (Ctrl-C: SIGINT to handoff, which passes it to
    // clusterctl), then --abort: every controller back, the source's first.
    let _ = std::fs::remove_file(&rec);
    let child = move_command(&source, &target, "beta", &[], &env(None))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("handoff move");
    eventually("the copy to start", WAIT, || {
        records(&rec)
            .iter()
            .any(|r| r["event"] == "copy-start")
            .then_some(())
    });
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let interrupted = child.wait_with_output().expect("handoff move");
    let log = text(&interrupted.stderr) + &text(&interrupted.stdout);
    say("an interrupted handoff move", &log);
    assert!(!interrupted.status.success(), "{log}");
    assert!(
        log.contains("interrupted; passing SIGINT to clusterctl")
            && log.contains("handoff was interrupted and passed the signal on")
            && log.contains("finish the move:"),
        "{log}"
    );
    assert!(
        records(&rec).iter().all(|r| r["event"] != "done"),
        "clusterctl did not stop"
    );
    stopped(&source, "move-beta");
    stopped(&target, "move-beta");
    let abort = handoff_move(&source, &target, "beta", &["--abort"], &env(None));
    let log = text(&abort.stderr) + &text(&abort.stdout);
    say("handoff move --abort", &log);
    assert!(abort.status.success(), "{log}");
    // On abort the source's controllers lead again first, as the Leases record it.
    let holder = window_holder("beta");
    led_first(
        &source_leases.led_again(&holder, &provider_leases(&source), WAIT),
        &target_leases.led_again(&holder, &provider_leases(&target), WAIT),
        "the source's controllers lead again first on abort",
    );
    assert!(
        log.contains("source Clusters still paused: beta/workload")
            && log.contains("Clusters in the target's namespace beta: "),
        "{log}"
    );
    for m in [&source, &target] {
        nothing_left(m, "beta");
        for p in &m.providers {
            m.rising(p);
        }
    }
    assert_eq!(
        target.get(&["movewindow", "move-beta"])["status"]["move"]["phase"],
        "Aborted"
    );
    eprintln!("timings: a plain move {:.1}s", took_plain.as_secs_f64());
    eprintln!(
        "timings: the whole test {:.1}s; the finishing move {:.1}s",
        started.elapsed().as_secs_f64(),
        took.as_secs_f64()
    );
}

/// `handoff move --all-namespaces` of two namespaces under one stop, clusterctl failing in the
/// second after its first create: the first stays moved and both clusters stay stopped;
/// `--abort` brings every controller back and leaves the first in the target, the second in
/// the source; the same command again moves what is left.
#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn handoff_move_all_namespaces_stops_once_and_an_abort_leaves_each_namespace_whole() {
    if skip()
        || !support::netns::in_own_netns(
            "handoff_move_all_namespaces_stops_once_and_an_abort_leaves_each_namespace_whole",
        )
    {
        return;
    }
    let source = Mgmt::start("source", providers(true, [10, 0, 0, 20]));
    let target = Mgmt::start("target", providers(false, [10, 0, 0, 21]));
    workload(&source, "one");
    workload(&source, "two");
    const WINDOW: &str = "move-all-namespaces";
    let all = |extra: &[&str], fail: bool| -> (bool, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
        cmd.arg("move")
            .arg("--kubeconfig")
            .arg(source.operator_kubeconfig())
            .arg("--to-kubeconfig")
            .arg(target.operator_kubeconfig())
            .arg("--all-namespaces")
            .arg("--clusterctl")
            .arg(standin())
            .args(extra)
            .env_remove("KUBECONFIG");
        if fail {
            cmd.env("CLUSTERCTL_STANDIN_FAIL_AFTER_CREATES", "1")
                .env("CLUSTERCTL_STANDIN_FAIL_IN_NAMESPACE", "two");
        }
        let out = cmd.output().expect("handoff move -A");
        let log = text(&out.stderr) + &text(&out.stdout);
        say(&format!("handoff move -A {extra:?}"), &log);
        (out.status.success(), log)
    };
    let cluster_in =
        |m: &Mgmt, ns: &str| m.exists(&["-n", ns, "clusters.cluster.x-k8s.io", "workload"]);

    // 0. The dry run: each namespace in order with what it holds; nothing written.
    let (ok, log) = all(&["--dry-run"], false);
    assert!(ok, "{log}");
    assert!(
        log.contains("would move 3 namespaces under one stop of both clusters")
            && log.contains("in this order:\n  one: Cluster one/workload\n  two: Cluster two/workload\n  webhook-probes: Cluster webhook-probes/probe-")
            && log.contains("Dry run: nothing was written."),
        "{log}"
    );
    assert!(!source.exists(&["movewindow", WINDOW]) && !target.exists(&["movewindow", WINDOW]));

    // 1. clusterctl fails in the second namespace.
    let (ok, log) = all(&[], true);
    assert!(!ok, "{log}");
    assert!(
        // The stand-in core provider's webhook is probed with a Cluster of its own.
        log.contains("3 namespaces, in this order: one, two, webhook-probes")
            && log.contains("injected failure")
            && log.contains("clusterctl moves namespace two again, then the rest"),
        "{log}"
    );
    stopped(&source, WINDOW);
    stopped(&target, WINDOW);
    let w = target.get(&["movewindow", WINDOW]);
    let rec = &w["status"]["move"];
    assert_eq!(rec["phase"], "Failed", "{w}");
    assert_eq!(
        rec["namespaces"],
        serde_json::json!([
            {"name": "one", "state": "Moved"},
            {"name": "two", "state": "Copying"},
            {"name": "webhook-probes", "state": "Pending"}
        ]),
        "{w}"
    );
    assert!(cluster_in(&target, "one") && !cluster_in(&source, "one"));
    assert!(cluster_in(&source, "two"));

    // 2. --abort: the controllers back, the first namespace stays in the target.
    let (ok, log) = all(&["--abort"], false);
    assert!(ok, "{log}");
    assert!(
        log.contains("namespace one moved already and stays in the target")
            && log.contains(
                "what clusterctl had copied of namespace two stays in the target, paused"
            ),
        "{log}"
    );
    nothing_left(&source, "two");
    nothing_left(&target, "one");
    let c = source.get(&["-n", "two", "clusters.cluster.x-k8s.io", "workload"]);
    assert_ne!(c["spec"]["paused"], true, "unpaused in the source: {c}");
    assert!(!cluster_in(&source, "one"));

    // 3. The same command again moves what is left, under one stop again.
    let (ok, log) = all(&[], false);
    assert!(ok, "{log}");
    assert!(
        log.contains("2 namespaces, in this order: two, webhook-probes"),
        "{log}"
    );
    for ns in ["one", "two"] {
        assert!(cluster_in(&target, ns) && !cluster_in(&source, ns), "{ns}");
    }
    let c = target.get(&["-n", "two", "clusters.cluster.x-k8s.io", "workload"]);
    assert_ne!(c["spec"]["paused"], true, "unpaused in the target: {c}");
    nothing_left(&source, "two");
    nothing_left(&target, "two");
}
