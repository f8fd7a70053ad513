//! `handoff move --all-namespaces` on a management cluster shaped like a real one (`classes.rs`
//! sets it up): a ClusterClass in a namespace of its own used by topology Clusters of two
//! others, a KubeadmControlPlane Cluster without a class in a fourth, and a cluster-scoped
//! object of a kind labelled for clusterctl's move hierarchy (a test CRD: the in-memory
//! provider has none).
//!
//! The whole move is killed between its first and second namespace, the same command is killed
//! inside the second (clusterctl's create of that namespace's Cluster in the target), and the
//! same command again finishes it; what is proven comes
//! from both clusters' records, each ordered by its own etcd revisions: every create in the
//! target and every delete in the source fall inside the window's hold of every provider Lease
//! of that cluster, and each Lease was taken once (one stop per cluster for every namespace,
//! across the kill). Then the whole target is backed up, lost and restored (`whole_backup.rs`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::classes::names;
use crate::crash::clusterctl_running;
use crate::support;
use support::apiserver::{eventually, text};
use support::capi::{Event, Mgmt, MovedObjects, PROVIDERS, Rig, WINDOW_HOLDER, Watch, held_at, rv};
use support::crash_proxy::{Agent, CrashProxies, Cue, Trigger};

/// The order `handoff move -A` finds for what is left in the source once team-a has moved:
/// `legacy` and `team-b` by name, `classes` after `team-b`, whose Cluster uses its class.
pub const ORDER: [&str; 3] = ["legacy", "team-b", "classes"];

/// A cluster-scoped kind clusterctl discovers (`clusterctl.cluster.x-k8s.io`) and moves as a
/// root of its own (`…/move-hierarchy`), as an infrastructure provider's global identity is.
const SITE_IDENTITY_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: siteidentities.identity.handoff.test
  labels:
    clusterctl.cluster.x-k8s.io: ""
    clusterctl.cluster.x-k8s.io/move-hierarchy: ""
spec:
  group: identity.handoff.test
  scope: Cluster
  names: {plural: siteidentities, singular: siteidentity, kind: SiteIdentity}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

/// The CRD in both clusters (clusterctl creates only kinds the target serves), and one
/// SiteIdentity in the source.
pub fn site_identity(src: &Mgmt, dst: &Mgmt) {
    for m in [src, dst] {
        let out = m.kubectl_stdin(&["apply", "-f", "-"], Some(SITE_IDENTITY_CRD));
        assert!(out.status.success(), "{}: {}", m.name, text(&out.stderr));
        m.ok(&[
            "wait",
            "--for=condition=Established",
            "crd/siteidentities.identity.handoff.test",
        ]);
    }
    let out = src.kubectl_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: identity.handoff.test/v1\nkind: SiteIdentity\nmetadata: {name: site-1}\nspec: {site: lab}\n"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// An IPAddressClaim nothing owns: a Cluster API kind that no root reaches, so clusterctl does
/// not carry it (cluster-api #9478); the dry run is to name it.
pub fn orphan_claim(m: &Mgmt, ns: &str) {
    let claim = format!(
        "apiVersion: ipam.cluster.x-k8s.io/v1beta2\nkind: IPAddressClaim\nmetadata: {{name: orphan, namespace: {ns}}}\nspec: {{poolRef: {{apiGroup: ipam.handoff.test, kind: TestPool, name: none}}}}\n"
    );
    let out = m.kubectl_stdin(&["apply", "-f", "-"], Some(&claim));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The claim the dry run named stays in the source, and nothing of it is in the target.
pub fn orphan_claim_left(src: &Mgmt, dst: &Mgmt, ns: &str) {
    let plural = "ipaddressclaims.ipam.cluster.x-k8s.io";
    assert_eq!(
        names(src, ns, plural),
        ["orphan"],
        "left in the source by clusterctl"
    );
    assert!(names(dst, ns, plural).is_empty());
}

fn has_site_identity(m: &Mgmt) -> bool {
    m.kubectl(&["get", "siteidentities.identity.handoff.test", "site-1"])
        .status
        .success()
}

pub fn log_of(out: &Output) -> String {
    text(&out.stdout) + &text(&out.stderr)
}

fn whole(rig: &Rig, from: &Path, to: &Path) -> std::process::Command {
    let mut cmd = rig.handoff(&rig.clusterctl(), &["--all-namespaces"]);
    cmd.arg("--kubeconfig")
        .arg(from)
        .arg("--to-kubeconfig")
        .arg(to);
    cmd
}

/// Both watches of one cluster, listed: every moved kind of every namespace, and the Leases.
pub fn watch(m: &Mgmt) -> (MovedObjects, Watch) {
    let (objects, leases) = (
        MovedObjects::start_all(m),
        Watch::start(m, &["leases", "-A"]),
    );
    eventually(
        &format!("{}: the watches listing", m.name),
        Duration::from_secs(120),
        || {
            let keys: Vec<String> = leases.events().iter().map(|e| e.key()).collect();
            (objects.listed()
                && PROVIDERS
                    .iter()
                    .all(|(ns, _, l)| keys.contains(&format!("{ns}/{l}"))))
            .then_some(())
        },
    );
    (objects, leases)
}

/// How often the window took each provider Lease of one cluster, from its Lease events in the
/// order of its etcd revisions.
pub fn holds_taken(leases: &Watch) -> Vec<(String, usize)> {
    let mut events = leases.events();
    events.sort_by_key(rv);
    PROVIDERS
        .iter()
        .map(|(ns, _, lease)| {
            let key = format!("{ns}/{lease}");
            let mut held = false;
            let mut taken = 0;
            for e in events.iter().filter(|e| e.key() == key) {
                let now = e.object["spec"]["holderIdentity"]
                    .as_str()
                    .is_some_and(|h| h.starts_with(WINDOW_HOLDER));
                taken += usize::from(now && !held);
                held = now;
            }
            (key, taken)
        })
        .collect()
}

/// The revision at which the window first let go of a provider Lease it held: the end of the
/// cluster's stop.
fn hold_end(leases: &Watch) -> Option<u64> {
    let mut events = leases.events();
    events.sort_by_key(rv);
    let mut held: BTreeSet<String> = BTreeSet::new();
    for e in &events {
        let window = e.object["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| h.starts_with(WINDOW_HOLDER));
        match window {
            true => {
                held.insert(e.key());
            }
            false if held.contains(&e.key()) => return Some(rv(e)),
            false => {}
        }
    }
    None
}

fn in_moved(e: &Event, namespaces: &[&str]) -> bool {
    namespaces
        .iter()
        .any(|ns| e.key().starts_with(&format!("{ns}/")))
}

/// Every create of `kind` (`ADDED`, `DELETED`) in `namespaces` before the cluster's stop ended
/// fell inside it, and there was one.
pub fn inside_the_stop(
    m: &Mgmt,
    objects: &MovedObjects,
    leases: &Watch,
    kind: &str,
    namespaces: &[&str],
) -> usize {
    let end = hold_end(leases).unwrap_or(u64::MAX);
    let writes: Vec<Event> = objects
        .events()
        .into_iter()
        .filter(|e| e.kind == kind && in_moved(e, namespaces) && rv(e) < end)
        .collect();
    assert!(
        !writes.is_empty(),
        "{}: no {kind} in {namespaces:?}",
        m.name
    );
    for e in &writes {
        held_at(m, leases, rv(e)).unwrap_or_else(|why| {
            panic!(
                "{kind} {} {} outside the stop: {why}",
                e.object["kind"],
                e.key()
            )
        });
    }
    writes.len()
}

/// `handoff move -A` through the crash proxies, killed at `cue`; its log.
fn killed_at(rig: &Rig, proxies: &CrashProxies, cue: Cue) -> String {
    proxies.set_source(0);
    proxies.arm(None, 0);
    let child = whole(rig, &proxies.kubeconfigs[0], &proxies.kubeconfigs[1])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("handoff move -A");
    proxies.arm_cues(vec![cue.clone()], child.id() as i32);
    let out = child.wait_with_output().expect("handoff move -A");
    proxies.disarm();
    let log = log_of(&out);
    eprintln!("handoff move -A, to be killed at {cue:?}:\n{log}");
    assert!(
        proxies.fired() && !out.status.success(),
        "handoff move -A was to be killed at {cue:?}:\n{log}"
    );
    eventually(
        "clusterctl gone with handoff (PDEATHSIG)",
        Duration::from_secs(30),
        || (!clusterctl_running(rig)).then_some(()),
    );
    log
}

/// Each namespace's state in the target's record, in order.
fn states(dst: &Mgmt) -> Vec<String> {
    let record = &dst.get(&["movewindow", "move-all-namespaces"])["status"]["move"];
    record["namespaces"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|n| {
            format!(
                "{} {}",
                n["name"].as_str().unwrap_or_default(),
                n["state"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// `handoff move -A` of what is left in the source, killed between its first and second
/// namespace (right before the first write of the step that records the first one moved, its
/// clusterctl done), then the same command killed inside the second namespace (at clusterctl's
/// create of its Cluster in the target), then the same command to its end; proven from both
/// clusters. Returns the log of the run that finished.
pub fn killed_between_and_inside_then_finished(
    rig: &Rig,
    src: &Mgmt,
    dst: &Mgmt,
    dir: &Path,
) -> String {
    let (src_objects, src_leases) = watch(src);
    let (dst_objects, dst_leases) = watch(dst);
    let proxies = CrashProxies::start([&src.kubeconfig, &dst.kubeconfig], dir);
    let between = Cue::KthStep {
        steps: vec!["Moved"],
        k: 1,
    };
    killed_at(rig, &proxies, between);
    // clusterctl moved legacy whole, and the record had not said so yet.
    assert_eq!(
        states(dst),
        ["legacy Copying", "team-b Pending", "classes Pending"]
    );
    assert!(names(src, "legacy", "clusters.cluster.x-k8s.io").is_empty());
    assert_eq!(names(dst, "legacy", "clusters.cluster.x-k8s.io"), ["l1"]);
    assert!(dst.window_holds_every_provider_lease() && src.window_holds_every_provider_lease());

    let inside = Cue::Handoff(Trigger {
        agent: Agent::Clusterctl,
        label: "POST clusters in target".into(),
        nth: 1,
    });
    let log = killed_at(rig, &proxies, inside);
    // legacy was in flight: clusterctl runs on it again, and finds nothing left to move.
    let (legacy, team_b) = (
        log.find("namespace legacy: running"),
        log.find("namespace team-b: running"),
    );
    assert!(
        legacy.is_some() && legacy < team_b,
        "clusterctl on legacy again, then team-b:\n{log}"
    );
    assert_eq!(
        states(dst),
        ["legacy Moved", "team-b Copying", "classes Pending"]
    );
    assert!(dst.window_holds_every_provider_lease() && src.window_holds_every_provider_lease());

    let t = Instant::now();
    let out = whole(rig, &src.kubeconfig, &dst.kubeconfig)
        .output()
        .expect("handoff move -A");
    let log = log_of(&out);
    eprintln!(
        "handoff move -A, the same command ({:.1}s, exit {:?}):\n{log}",
        t.elapsed().as_secs_f64(),
        out.status.code()
    );
    assert!(out.status.success(), "{log}");
    assert!(log.contains("going on from where it stopped"), "{log}");
    let runs: Vec<Option<usize>> = ORDER
        .iter()
        .map(|ns| log.find(&format!("namespace {ns}: running")))
        .collect();
    assert!(
        runs[0].is_none() && runs[1].is_some() && runs[2].is_some() && runs[1] < runs[2],
        "clusterctl again on team-b (in flight), then classes; not on legacy (moved):\n{log}"
    );
    // One stop of each cluster for every namespace, across the kill.
    for (m, leases) in [(src, &src_leases), (dst, &dst_leases)] {
        for (lease, taken) in holds_taken(leases) {
            assert_eq!(
                taken, 1,
                "{}: Lease {lease} taken by the window {taken} times",
                m.name
            );
        }
    }
    let created = inside_the_stop(dst, &dst_objects, &dst_leases, "ADDED", &ORDER);
    let deleted = inside_the_stop(src, &src_objects, &src_leases, "DELETED", &ORDER);
    eprintln!(
        "{created} creates in the target and {deleted} deletes in the source, all inside each cluster's one stop"
    );
    log
}

/// What the whole move leaves: the cluster-scoped object in both (clusterctl copies it and never
/// deletes it), the classes gone from the source.
pub fn site_identity_in_both(src: &Mgmt, dst: &Mgmt) {
    assert!(
        has_site_identity(dst),
        "SiteIdentity site-1 copied to the target"
    );
    assert!(
        has_site_identity(src),
        "SiteIdentity site-1 left in the source, as clusterctl leaves every cluster-scoped object"
    );
}
