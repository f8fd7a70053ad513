//! A ClusterClass shared across namespaces, on the real Cluster API with ClusterTopology on:
//! the class in `classes`, a topology Cluster of it in `team-a` and another in `team-b`.
//!
//! What clusterctl does with it (read from its source, `cmd/clusterctl/client/cluster/`):
//! `clusterctl move -n team-a` discovers the class of another namespace that team-a's Cluster
//! uses (`objectgraph.go`, `Discovery`), pauses it in the source (`mover.go`, `move`), copies it,
//! never deletes it from the source (`setShouldNotDelete`), and unpauses only its copy in the
//! target. Since v1.12 it refuses to start while a ClusterClass of its graph is paused
//! (`checkClusterClassesNotPaused`), so team-b's move is refused after team-a's. The test
//! asserts that refusal of plain clusterctl, so it notices when clusterctl changes.
//!
//! handoff: team-a's move killed mid-copy (clusterctl's first MachineSet in the target) is
//! finished by the same command (the class clusterctl paused is put back before clusterctl
//! runs again); the class's namespace is refused while team-b's Cluster still uses it; then
//! `handoff move --all-namespaces` moves what is left (`whole.rs`): a KubeadmControlPlane
//! Cluster without a class in `legacy`, team-b, then the class's namespace, under one stop of
//! both clusters, killed between legacy and team-b, then inside team-b, and finished by the same
//! command; every Cluster is
//! re-provisioned by the target's controllers, nothing is left paused in either cluster, and
//! the cluster-scoped SiteIdentity is in both. Last, the target is backed up whole, lost, and
//! restored whole into the first cluster.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::crash::clusterctl_running;
use crate::support;
use crate::support::apiserver::{eventually, skip, text};
use crate::support::capi::{Mgmt, Rig};
use crate::support::crash_proxy::{Agent, CrashProxies, Trigger};
use crate::{whole, whole_backup};

const CLASS: &str = "quick";

/// `clusterclass.sh` (`../shared/capi`): the class, or a topology Cluster of it.
fn clusterclass(rig: &Rig, m: &Mgmt, args: &[&str]) {
    let out = Command::new(rig.scripts.join("clusterclass.sh"))
        .arg(args[0])
        .arg(&m.kubeconfig)
        .args(&args[1..])
        .env("CAPI_ROOT", &rig.root)
        .output()
        .expect("clusterclass.sh");
    assert!(
        out.status.success(),
        "clusterclass.sh {args:?}: {}",
        text(&out.stderr)
    );
}

/// Every Cluster and ClusterClass of `m` that is paused (`spec.paused` or the annotation), as
/// `Kind namespace/name`.
pub fn paused(m: &Mgmt) -> Vec<String> {
    let mut out = Vec::new();
    for (kind, plural) in [
        ("Cluster", "clusters.cluster.x-k8s.io"),
        ("ClusterClass", "clusterclasses.cluster.x-k8s.io"),
    ] {
        for o in m.get(&[plural, "-A"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let md = &o["metadata"];
            if o["spec"]["paused"] == true
                || md["annotations"]["cluster.x-k8s.io/paused"].is_string()
            {
                out.push(format!(
                    "{kind} {}/{}",
                    md["namespace"].as_str().unwrap_or(""),
                    md["name"].as_str().unwrap_or("")
                ));
            }
        }
    }
    out
}

/// The names of `plural` in `ns` of `m`.
/// The names of the objects of `plural` in `ns`.
pub fn names(m: &Mgmt, ns: &str, plural: &str) -> Vec<String> {
    m.get(&["-n", ns, plural])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn log_of(out: &Output) -> String {
    text(&out.stdout) + &text(&out.stderr)
}

fn handoff_move(rig: &Rig, from: &Mgmt, to: &Mgmt, ns: &str, extra: &[&str]) -> Output {
    let t = Instant::now();
    let out = rig
        .handoff_move(&from.kubeconfig, &to.kubeconfig, ns)
        .args(extra)
        .output()
        .expect("handoff move");
    eprintln!(
        "handoff move -n {ns} {extra:?} ({} → {}, {:.1}s, exit {:?}):\n{}",
        from.name,
        to.name,
        t.elapsed().as_secs_f64(),
        out.status.code(),
        log_of(&out)
    );
    out
}

fn plain_clusterctl_move(rig: &Rig, from: &Mgmt, to: &Mgmt, ns: &str) -> Output {
    let mut cmd = Command::new(rig.clusterctl());
    cmd.arg("move")
        .arg("--kubeconfig")
        .arg(&from.kubeconfig)
        .arg("--to-kubeconfig")
        .arg(&to.kubeconfig)
        .args(["--namespace", ns]);
    for (k, v) in rig.clusterctl_env() {
        cmd.env(k, v);
    }
    cmd.output().expect("clusterctl move")
}

fn wait_provisioned(m: &Mgmt, ns: &str, name: &str) {
    let said = eventually(
        &format!("{}: {ns}/{name} provisioned by its controllers", m.name),
        Duration::from_secs(300),
        || m.provisioned(ns, name, 2),
    );
    eprintln!("{}: {said}", m.name);
}

/// What kube-controller-manager's garbage collector would have done for a topology Cluster,
/// which envtest does not run. The topology controller creates the InfrastructureCluster and
/// the ControlPlane with a temporary owner, a `<cluster>-shim` Secret, and deletes the shim once
/// the Cluster owns both (`core/reconcilers/topology/cluster/reconcile_state.go`,
/// `reconcileClusterShim`); the garbage collector then removes the owner reference to the
/// deleted shim. Without it the reference stays, and clusterctl, which moves an object only
/// after all its owners (`getMoveSequence`), silently leaves the DevCluster and the
/// KubeadmControlPlane (and their Machines) in the source. Here: once the Cluster owns both,
/// the shim is deleted where it is still there (its owner's rule) and every owner reference to
/// a Secret that no longer exists is removed (the collector's).
fn collect_garbage(m: &Mgmt, ns: &str) {
    let kinds = "devclusters.infrastructure.cluster.x-k8s.io,kubeadmcontrolplanes.controlplane.cluster.x-k8s.io";
    let owned_by_cluster = |o: &serde_json::Value| {
        o["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["kind"] == "Cluster"))
    };
    let objects = eventually(
        &format!(
            "{}: {ns}'s DevCluster and KubeadmControlPlane owned by their Cluster",
            m.name
        ),
        Duration::from_secs(120),
        || {
            let items = m.get(&["-n", ns, kinds])["items"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            (items.len() == 2 && items.iter().all(owned_by_cluster)).then_some(items)
        },
    );
    for o in &objects {
        let refs = o["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for r in refs.iter().filter(|r| r["kind"] == "Secret") {
            let shim = r["name"].as_str().unwrap_or_default();
            let left = m.kubectl(&["-n", ns, "get", "secret", shim, "-o", "json"]);
            eprintln!(
                "{}: {ns}: {} {} is owned by Secret {shim}, which {}",
                m.name,
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default(),
                if left.status.success() {
                    "is still there: deleting it, as the topology controller would"
                } else {
                    "is gone"
                }
            );
            if left.status.success() {
                m.ok(&["-n", ns, "delete", "secret", shim, "--wait=false"]);
                // Gone at once, or held by a finalizer nothing here would remove.
                let _ = m.kubectl(&[
                    "-n",
                    ns,
                    "patch",
                    "secret",
                    shim,
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let kept: Vec<&serde_json::Value> = refs.iter().filter(|r| r["kind"] != "Secret").collect();
        if kept.len() < refs.len() {
            let kind = format!(
                "{}.{}",
                o["kind"].as_str().unwrap_or_default().to_lowercase() + "s",
                o["apiVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .split('/')
                    .next()
                    .unwrap_or_default()
            );
            let patch = serde_json::json!({"metadata": {"ownerReferences": kept}}).to_string();
            m.ok(&[
                "-n",
                ns,
                "patch",
                &kind,
                o["metadata"]["name"].as_str().unwrap_or_default(),
                "--type",
                "merge",
                "-p",
                &patch,
            ]);
        }
    }
}

/// team-a's move killed by the crash proxy at clusterctl's first MachineSet in the target:
/// clusterctl has paused the shared class and copied part of the namespace, deleted nothing.
fn team_a_killed_mid_copy(rig: &Rig, src: &Mgmt, dst: &Mgmt, dir: &std::path::Path) {
    let proxies = CrashProxies::start([&src.kubeconfig, &dst.kubeconfig], dir);
    proxies.set_source(0);
    proxies.arm(None, 0);
    let child = rig
        .handoff_move(&proxies.kubeconfigs[0], &proxies.kubeconfigs[1], "team-a")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("handoff move");
    proxies.arm(
        Some(Trigger {
            agent: Agent::Clusterctl,
            label: "POST machinesets in target".into(),
            nth: 1,
        }),
        child.id() as i32,
    );
    let out = child.wait_with_output().expect("handoff move");
    proxies.disarm();
    let log = log_of(&out);
    assert!(
        proxies.fired() && !out.status.success(),
        "handoff move -n team-a was to be killed at clusterctl's first MachineSet in the target:\n{log}"
    );
    eventually(
        "clusterctl gone with handoff (PDEATHSIG)",
        Duration::from_secs(30),
        || (!clusterctl_running(rig)).then_some(()),
    );
    let creates: Vec<String> = proxies
        .take_log()
        .iter()
        .filter(|w| w.agent == Agent::Clusterctl && w.label.starts_with("POST "))
        .map(|w| w.label.clone())
        .collect();
    eprintln!("killed mid-copy; clusterctl's creates: {creates:?}\nhandoff's output:\n{log}");
    // What the kill left: clusterctl paused the class of the other namespace, copied part of
    // team-a, and deleted nothing from the source.
    assert!(
        paused(src).contains(&format!("ClusterClass classes/{CLASS}")),
        "{:?}",
        paused(src)
    );
    assert_eq!(names(src, "team-a", "clusters.cluster.x-k8s.io"), ["a1"]);
    assert_eq!(names(dst, "team-a", "clusters.cluster.x-k8s.io"), ["a1"]);
}

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn a_cluster_class_shared_across_namespaces_moves_with_each_and_last_on_its_own() {
    if skip()
        || !support::netns::in_own_netns(
            "classes::a_cluster_class_shared_across_namespaces_moves_with_each_and_last_on_its_own",
        )
    {
        return;
    }
    let Some(rig) = Rig::find() else {
        return;
    };
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let env = [
        ("FEATURE_GATES", "ClusterTopology=true"),
        ("LEASE_DURATION", "6s"),
        ("RENEW_DEADLINE", "4s"),
        ("RETRY_PERIOD", "1s"),
    ];
    let mut clusters = rig.up(dir.path(), &["src", "dst"], &env);
    let dst = clusters.pop().unwrap();
    let src = clusters.pop().unwrap();
    whole::site_identity(&src, &dst);
    let legacy = src.workload(&rig, "legacy", "l1", 1);
    clusterclass(&rig, &src, &["class", "classes", CLASS]);
    for (ns, name) in [("team-a", "a1"), ("team-b", "b1")] {
        clusterclass(&rig, &src, &["topology", ns, name, "classes", CLASS]);
    }
    for (ns, name) in [("team-a", "a1"), ("team-b", "b1")] {
        wait_provisioned(&src, ns, name);
        collect_garbage(&src, ns);
    }
    let w = legacy.wait_with_output().expect("workload.sh");
    assert!(
        w.status.success(),
        "workload legacy/l1: {}",
        text(&w.stderr)
    );
    whole::orphan_claim(&src, "legacy");
    eprintln!("set up in {:.1}s", t0.elapsed().as_secs_f64());

    // The dry runs say what clusterctl leaves behind, and what is refused, writing nothing.
    let dry = handoff_move(&rig, &src, &dst, "team-a", &["--dry-run"]);
    let log = log_of(&dry);
    assert!(dry.status.success(), "{log}");
    assert!(
        log.contains(&format!("clusterctl copies ClusterClass classes/{CLASS} to the target and leaves it in the source")),
        "{log}"
    );
    let dry = handoff_move(&rig, &src, &dst, "classes", &["--dry-run"]);
    let log = log_of(&dry);
    assert!(
        log.contains("would refuse: the namespace holds ClusterClasses and no Cluster")
            && log.contains(&format!(
                "Cluster team-a/a1 uses ClusterClass classes/{CLASS}"
            )),
        "{log}"
    );
    assert!(paused(&src).is_empty(), "{:?}", paused(&src));

    // team-a, killed mid-copy: clusterctl paused the class, so plain clusterctl refuses team-b
    // (the test notices when clusterctl changes); then team-a is finished by the same command.
    team_a_killed_mid_copy(&rig, &src, &dst, dir.path());
    let out = plain_clusterctl_move(&rig, &src, &dst, "team-b");
    let log = log_of(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("cannot start operation while the following ClusterClasses are paused")
            && log.contains(CLASS),
        "clusterctl's refusal changed:\n{log}"
    );
    let out = handoff_move(&rig, &src, &dst, "team-a", &[]);
    let log = log_of(&out);
    assert!(out.status.success(), "the re-run of team-a's move:\n{log}");
    assert!(
        log.contains(&format!(
            "source: unpaused ClusterClass classes/{CLASS} (clusterctl paused it)"
        )),
        "the re-run puts the class back before clusterctl runs again:\n{log}"
    );
    assert!(
        log.contains(&format!("source: unpaused ClusterClass classes/{CLASS} (clusterctl paused it and left it in the source")),
        "{log}"
    );
    assert!(paused(&src).is_empty(), "{:?}", paused(&src));
    assert!(names(&src, "team-a", "clusters.cluster.x-k8s.io").is_empty());

    // The class's namespace, while team-b's Cluster still uses the class: refused by name,
    // nothing written.
    let out = handoff_move(&rig, &src, &dst, "classes", &[]);
    let log = log_of(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "Cluster team-b/b1 uses ClusterClass classes/{CLASS}"
        )) && log.contains("this one last"),
        "{log}"
    );
    for m in [&src, &dst] {
        m.nothing_of_handoff_at_all();
    }

    // What is left of the source in one whole move: legacy and team-b by name, the classes'
    // namespace after team-b. Its dry run first.
    let dry = rig
        .handoff(&rig.clusterctl(), &["--all-namespaces", "--dry-run"])
        .arg("--kubeconfig")
        .arg(&src.kubeconfig)
        .arg("--to-kubeconfig")
        .arg(&dst.kubeconfig)
        .output()
        .expect("handoff move -A --dry-run");
    let log = log_of(&dry);
    assert!(dry.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "in this order:\n  legacy: Cluster legacy/l1\n    left in the source: clusterctl's dry run does not carry IPAddressClaim legacy/orphan (no Cluster, ClusterClass or labelled root reaches it)\n  team-b: Cluster team-b/b1 (ClusterClass classes/{CLASS})\n  classes: ClusterClass classes/{CLASS}\ncluster-scoped, copied to the target with the first namespace and left in the source (clusterctl never deletes a cluster-scoped object: mover.go, deleteSourceObject): SiteIdentity site-1\nDry run: nothing was written."
        )),
        "{log}"
    );
    for m in [&src, &dst] {
        m.nothing_of_handoff_at_all();
    }
    whole::killed_between_and_inside_then_finished(&rig, &src, &dst, dir.path());
    assert!(
        names(&src, "classes", "clusterclasses.cluster.x-k8s.io").is_empty(),
        "the classes' own move deletes them from the source"
    );
    assert_eq!(
        names(&dst, "classes", "clusterclasses.cluster.x-k8s.io"),
        [CLASS]
    );
    whole::site_identity_in_both(&src, &dst);
    whole::orphan_claim_left(&src, &dst, "legacy");
    for (ns, name) in [("team-a", "a1"), ("team-b", "b1"), ("legacy", "l1")] {
        wait_provisioned(&dst, ns, name);
    }
    for m in [&src, &dst] {
        assert!(paused(m).is_empty(), "{}: {:?}", m.name, paused(m));
        m.nothing_of_handoff_at_all();
    }

    // The target backed up whole, lost, and restored whole into the first cluster.
    let all = ["classes", "legacy", "team-a", "team-b"];
    whole_backup::backed_up_lost_and_restored(&rig, dst, &src, dir.path(), &all);
    for (ns, name) in [("team-a", "a1"), ("team-b", "b1"), ("legacy", "l1")] {
        wait_provisioned(&src, ns, name);
    }
    assert!(paused(&src).is_empty(), "{:?}", paused(&src));
    eprintln!("whole test {:.1}s", t0.elapsed().as_secs_f64());
}
