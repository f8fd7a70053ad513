//! How a former leader's stop is proven, on the real managers of `../shared/capi` (podsim
//! reports container ends as the kubelet does): by the kubelet's report of its end where there
//! is one (a restart in place, here; a deleted Pod's last status in `moves`), and by the
//! Lease's bound, with the reason said, where there is none: a Pod force-deleted after the
//! take-over, and a holder whose Pod was gone before it.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support;
use crate::support::apiserver::{eventually, skip, text};
use crate::support::capi::{Mgmt, Rig};

fn handoff(m: &Mgmt, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(&m.kubeconfig)
        .env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// `window open NAME` of one provider, with no standby: its only Pod is not deleted.
fn open(m: &Mgmt, window: &str, provider: &str) -> Child {
    let selector = format!("cluster.x-k8s.io/provider={provider}");
    handoff(
        m,
        &[
            "window",
            "open",
            window,
            "-l",
            &selector,
            "--no-standby",
            "--wait-timeout",
            "0s",
        ],
    )
    .spawn()
    .expect("handoff window open")
}

fn finished(child: Child, what: &str) -> String {
    let out: Output = child.wait_with_output().expect("handoff");
    let log = text(&out.stdout) + &text(&out.stderr);
    assert!(out.status.success(), "{what}:\n{log}");
    for line in log
        .lines()
        .filter(|l| l.contains(": Lease ") && l.contains("after the take-over"))
    {
        eprintln!("{what}: {line}");
    }
    log
}

fn close(m: &Mgmt, window: &str) {
    let out = handoff(m, &["window", "close", window])
        .output()
        .expect("close");
    assert!(
        out.status.success(),
        "close {window}: {}",
        text(&out.stderr)
    );
}

/// The one held Lease of `window`, as recorded.
fn held(m: &Mgmt, window: &str) -> Value {
    let w = m.get(&["movewindow", window]);
    w["status"]["pinned"][0]["leases"][0].clone()
}

fn leader_pod(m: &Mgmt, ns: &str, lease: &str) -> String {
    let l = m.get(&["-n", ns, "lease", lease]);
    let holder = l["spec"]["holderIdentity"].as_str().unwrap_or_default();
    holder
        .split_once('_')
        .map(|(p, _)| p)
        .unwrap_or_default()
        .to_string()
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_stop_is_proven_by_the_leaders_end_or_by_the_lease_bound_with_the_reason() {
    if skip()
        || !support::netns::in_own_netns(
            "proofs::a_stop_is_proven_by_the_leaders_end_or_by_the_lease_bound_with_the_reason",
        )
    {
        return;
    }
    let Some(rig) = Rig::find() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut m = rig.up(dir.path(), &["m"], &[]).pop().unwrap();
    m.register_handoff();

    // A restart in place: the core manager's only Pod is not deleted; its leader notices the
    // Lease lost within its renew deadline, exits, and the kubelet reports the instance that
    // led under `lastState.terminated`.
    let log = finished(open(&m, "restart", "cluster-api"), "open restart");
    let lease = held(&m, "restart");
    assert_eq!(lease["proof"]["by"], "Exited", "{lease}\n{log}");
    assert!(
        log.contains("its leader exited, reported by the kubelet"),
        "{log}"
    );
    close(&m, "restart");

    // A force delete right after the take-over: the Pod goes with no report of its end (its
    // process may outlive it), so only the bound proves the stop, and it says why.
    let (ns, lease_name) = ("capd-system", "controller-leader-election-capd");
    let child = open(&m, "force", "infrastructure-docker");
    let pod = eventually(
        "the window recording the CAPD leader's Pod",
        Duration::from_secs(120),
        || {
            let out = m.kubectl(&["get", "movewindow", "force", "-o", "json"]);
            let w: Value = serde_json::from_slice(&out.stdout).ok()?;
            w["status"]["pinned"][0]["leases"][0]["formerPod"]["name"]
                .as_str()
                .map(str::to_string)
        },
    );
    m.ok(&[
        "-n",
        ns,
        "delete",
        "pod",
        &pod,
        "--grace-period=0",
        "--force",
    ]);
    let log = finished(child, "open force");
    let lease = held(&m, "force");
    assert_eq!(lease["proof"]["by"], "LeaseBound", "{lease}\n{log}");
    let reason = lease["proof"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("force delete") && reason.contains(&pod),
        "{reason}"
    );
    assert!(
        log.contains(&format!("Lease {lease_name}: Lease bound: 15s after the take-over, because its Pod {pod} went with no report of its containers ending")),
        "{log}"
    );
    close(&m, "force");

    // A holder whose Pod is gone before the take-over (force-deleted; the Lease still names
    // it): nothing to watch, so the bound, and why.
    let (ns, lease_name) = (
        "capi-kubeadm-bootstrap-system",
        "kubeadm-bootstrap-manager-leader-election-capi",
    );
    let gone = eventually(
        "the bootstrap manager leading",
        Duration::from_secs(120),
        || Some(leader_pod(&m, ns, lease_name)).filter(|p| !p.is_empty()),
    );
    m.ok(&[
        "-n",
        ns,
        "delete",
        "pod",
        &gone,
        "--grace-period=0",
        "--force",
    ]);
    let log = finished(open(&m, "gone", "bootstrap-kubeadm"), "open gone");
    let lease = held(&m, "gone");
    // The Lease still named the gone Pod at the take-over (its replacement waits for its
    // lease to run out, 15 s, and the take-over came first).
    assert!(
        lease["formerHolder"]
            .as_str()
            .is_some_and(|h| h.starts_with(&format!("{gone}_"))),
        "{lease}\n{log}"
    );
    assert_eq!(lease["proof"]["by"], "LeaseBound", "{lease}\n{log}");
    let reason = lease["proof"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("its Pod {gone} was gone")),
        "{reason}"
    );
    close(&m, "gone");
}
