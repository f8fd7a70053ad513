//! The window's plan, pure: which way each selected Deployment is stopped, which count is saved
//! and restored, what a Lease take-over and release write, when a former leader is proven
//! stopped, and in which order clusters are restored. The commands (`open`, `close`) read the
//! cluster, ask this module, and write what it says.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use crate::resources::move_window::{MoveRole, PinnedDeployment, StopPolicy, Strategy};
use crate::rules::lease_hold::{
    FORMER_DURATION_ANNOTATION, FORMER_HOLDER_ANNOTATION, HELD_BY_LABEL, OPERATOR_ANNOTATION,
    holder_identity, window_of_holder,
};
use crate::rules::move_window::{SAVED_REPLICAS_ANNOTATION, SavedReplicas};

/// The `leaseDurationSeconds` a window writes: ten years. A candidate treats a Lease as taken
/// until `leaseDurationSeconds` after it last saw the record change, on its own clock
/// (client-go `tools/leaderelection/leaderelection.go`, `tryAcquireOrRenew` and
/// `isLeaseValid`), so no candidate sees this one expire while a window is open.
pub const HOLD_SECONDS: i32 = 315_360_000;

/// controller-runtime's default `LeaseDuration` (`pkg/manager/manager.go`), assumed for a
/// Lease that records none.
pub const DEFAULT_LEASE_SECONDS: i32 = 15;

// ---- Scale ----

/// What pinning a Deployment comes to, read from the Deployment alone: `open` acts on it,
/// `open --dry-run` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinPlan {
    /// At 0 with a readable saved count: nothing to write.
    AlreadyPinned(SavedReplicas),
    /// At 0 with an annotation nobody can read: left for `close` to report (restores 1).
    PinnedUnreadable,
    /// Save this count (0 when it already stands at 0) and scale to 0.
    Save(i32),
}

pub fn pin_plan(d: &Deployment) -> PinPlan {
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let annotation = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION));
    match (replicas, annotation.map(|a| SavedReplicas::parse(a))) {
        (0, Some(Some(s))) => PinPlan::AlreadyPinned(s),
        (0, Some(None)) => PinPlan::PinnedUnreadable,
        (n, _) => PinPlan::Save(n),
    }
}

/// The count `close` restores a Scale-stopped Deployment to, and what it had to assume.
pub fn restore_count(
    annotation: Option<&str>,
    recorded: Option<&PinnedDeployment>,
) -> (i32, Option<String>) {
    match (annotation.map(SavedReplicas::parse), recorded) {
        (Some(Some(s)), _) => (s.0, None),
        // The annotation is gone but this window recorded the count: a run that died after
        // restoring (close records before it writes), or a client that removed it. The record
        // is the better truth than a guess of 1.
        (None, Some(p)) => (p.saved_replicas, p.note.clone()),
        (Some(None), _) => (
            1,
            Some(format!(
                "annotation {SAVED_REPLICAS_ANNOTATION}={:?} is unreadable; restored to 1",
                annotation.unwrap_or_default()
            )),
        ),
        (None, None) => (1, Some("no saved count anywhere; restored to 1".into())),
    }
}

// ---- Lease: whose is it ----

/// A Lease as the plan reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseSeen {
    pub name: String,
    pub holder: String,
    pub duration: Option<i32>,
    pub transitions: i32,
    pub resource_version: Option<String>,
    /// `handoff.dev/held-by-window`.
    pub held_by: Option<String>,
    pub former_holder: Option<String>,
    pub former_duration: Option<i32>,
    /// `handoff.dev/window-operator`: who may write it while it is held.
    pub operator: Option<String>,
    /// `spec.renewTime`.
    pub renewed: Option<Timestamp>,
}

impl LeaseSeen {
    pub fn from_lease(l: &Lease) -> LeaseSeen {
        let spec = l.spec.as_ref();
        let ann = |k: &str| {
            l.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .cloned()
        };
        LeaseSeen {
            name: l.metadata.name.clone().unwrap_or_default(),
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            duration: spec.and_then(|s| s.lease_duration_seconds),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            resource_version: l.metadata.resource_version.clone(),
            held_by: l
                .metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(HELD_BY_LABEL))
                .cloned(),
            former_holder: ann(FORMER_HOLDER_ANNOTATION),
            former_duration: ann(FORMER_DURATION_ANNOTATION).and_then(|d| d.parse().ok()),
            operator: ann(OPERATOR_ANNOTATION),
            renewed: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
        }
    }

    /// The window that holds it: its holder identity is the window's. The label alone proves
    /// nothing: a candidate that acquires the Lease once it is free (freed by hand, or written
    /// while the guard was down) sends back the object it read with only `spec` changed
    /// (client-go `tools/leaderelection/resourcelock/leaselock.go`, `Update`), so the label
    /// outlives the hold. See `taken_back`.
    pub fn window(&self) -> Option<&str> {
        window_of_holder(&self.holder)
    }

    /// A hold taken back: labelled as held by a window while another holder (or nobody) holds
    /// it. `(window, holder now)`.
    pub fn taken_back(&self) -> Option<(&str, &str)> {
        let w = self.held_by.as_deref()?;
        (self.window() != Some(w)).then_some((w, self.holder.as_str()))
    }
}

/// The pod a leader-election identity names: controller-runtime's is `os.Hostname() + "_" +
/// uuid` (`pkg/leaderelection/leader_election.go`), and a pod's hostname is its name, which
/// cannot contain `_`.
pub fn pod_of_identity(identity: &str) -> Option<&str> {
    let (pod, id) = identity.split_once('_')?;
    (!pod.is_empty() && !id.is_empty()).then_some(pod)
}

/// Whether `pod` is named as the Deployment controller names the pods of `deployment`:
/// `<deployment>-<pod-template-hash>-<suffix>`. Exact on the prefix, so that
/// `capi-controller-manager` never claims `capi-controller-manager-extra-…`'s pods.
pub fn pod_of_deployment(pod: &str, deployment: &str) -> bool {
    let Some(rest) = pod
        .strip_prefix(deployment)
        .and_then(|r| r.strip_prefix('-'))
    else {
        return false;
    };
    let alnum = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    match rest.split_once('-') {
        Some((hash, suffix)) => alnum(hash) && alnum(suffix),
        None => false,
    }
}

/// How a Lease in a Deployment's namespace relates to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// A pod of the Deployment holds it, or last held it (the holder may be long gone).
    Its(LeaseSeen),
    /// This window holds it, taken from a pod of the Deployment.
    HeldHere(LeaseSeen),
    /// Another window holds it, taken from a pod of the Deployment.
    HeldElsewhere(LeaseSeen, String),
}

impl Claim {
    pub fn lease(&self) -> &LeaseSeen {
        match self {
            Claim::Its(l) | Claim::HeldHere(l) | Claim::HeldElsewhere(l, _) => l,
        }
    }
}

/// The Leases in its namespace that belong to `deployment`, found from their holders (never
/// from a list of names: providers name them as they like).
pub fn claims(deployment: &str, leases: &[LeaseSeen], window: &str) -> Vec<Claim> {
    let mut out: Vec<Claim> = leases
        .iter()
        .filter_map(|l| {
            let mine =
                |h: &str| pod_of_identity(h).is_some_and(|p| pod_of_deployment(p, deployment));
            match l.window() {
                Some(w) => l.former_holder.as_deref().filter(|h| mine(h)).map(|_| {
                    if w == window {
                        Claim::HeldHere(l.clone())
                    } else {
                        Claim::HeldElsewhere(l.clone(), w.to_string())
                    }
                }),
                None => mine(&l.holder).then(|| Claim::Its(l.clone())),
            }
        })
        .collect();
    out.sort_by(|a, b| a.lease().name.cmp(&b.lease().name));
    out
}

/// How long a Lease written free is taken for one that a candidate is about to take: client-go
/// candidates try again every `RetryPeriod` plus up to 120 % jitter
/// (`tools/leaderelection/leaderelection.go`, `acquire`: `wait.JitterUntil(…, RetryPeriod,
/// JitterFactor 1.2, …)`): 2–4.4 s for Cluster API's managers, 5–11 s for the kubeadm control
/// plane. Longer than any of those, and short enough to wait out where none comes.
pub const RELEASE_SETTLES: SignedDuration = SignedDuration::from_secs(30);

/// A Lease written free moments ago (an empty holder: a release, client-go's or a window's)
/// that no candidate has taken yet: until one does, nothing on it names the Deployment whose
/// Lease it is, so `claims` finds none and that Deployment would look like one without leader
/// election (and be pinned to 0). `Some(until)`: how long to wait for a candidate to take it.
/// A Lease free for longer (its Deployment has no candidate) is what it looks like.
pub fn awaits_candidate(l: &LeaseSeen, now: Timestamp) -> Option<Timestamp> {
    let until = l.renewed?.checked_add(RELEASE_SETTLES).ok()?;
    (l.holder.is_empty() && now < until).then_some(until)
}

/// How `open` stops one Deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopChoice {
    /// Hold these Leases (by name).
    Lease(Vec<String>),
    Scale,
    Refuse(StopRefusal),
}

/// Why a window may not stop a Deployment or take, write or release its Lease: kept typed to
/// the command line, which says it once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopRefusal {
    #[error(
        "{deployment}: its Lease {lease} is held by MoveWindow {window:?}; close that window first, or stop this Deployment with it"
    )]
    LeaseInOtherWindow {
        deployment: String,
        lease: String,
        window: String,
    },
    #[error(
        "{0}: no Lease in its namespace is held, or was last held, by one of its pods (holder <deployment>-<hash>-<suffix>_<id>), so it cannot be stopped by Lease; open with --stop auto or --stop scale"
    )]
    NoLease(String),
    #[error("Lease {lease} is held by MoveWindow {window:?}")]
    TakenByOther { lease: String, window: String },
    #[error(
        "Lease {lease} is held by MoveWindow {window:?} for its operator {operator:?}, and only that user may write it: run this command as {operator:?}"
    )]
    ForAnotherOperator {
        lease: String,
        window: String,
        operator: String,
    },
}

/// A Deployment already recorded keeps the strategy it was stopped with (a re-run finishes
/// what the first run began, and never flips a half-stopped controller); a new one is stopped
/// by Lease when its pods hold or last held one, unless the window says otherwise.
pub fn choose_stop(
    policy: StopPolicy,
    what: &str,
    recorded: Option<&PinnedDeployment>,
    claims: &[Claim],
) -> StopChoice {
    if let Some((l, w)) = claims.iter().find_map(|c| match c {
        Claim::HeldElsewhere(l, w) => Some((l, w)),
        _ => None,
    }) {
        return StopChoice::Refuse(StopRefusal::LeaseInOtherWindow {
            deployment: what.to_string(),
            lease: l.name.clone(),
            window: w.clone(),
        });
    }
    let names = |extra: &[String]| {
        let mut n: Vec<String> = extra
            .iter()
            .cloned()
            .chain(claims.iter().map(|c| c.lease().name.clone()))
            .collect();
        n.sort();
        n.dedup();
        n
    };
    if let Some(p) = recorded.filter(|p| p.restored_at.is_none()) {
        return match p.strategy() {
            Strategy::Lease => StopChoice::Lease(names(
                &p.leases.iter().map(|l| l.name.clone()).collect::<Vec<_>>(),
            )),
            Strategy::Scale => StopChoice::Scale,
        };
    }
    match (policy, claims.is_empty()) {
        (StopPolicy::Scale, _) => StopChoice::Scale,
        (StopPolicy::Auto, true) => StopChoice::Scale,
        (StopPolicy::Lease, true) => StopChoice::Refuse(StopRefusal::NoLease(what.to_string())),
        (_, false) => StopChoice::Lease(names(&[])),
    }
}

/// A Lease this window holds for another operator: writing it again (a re-run) or releasing it
/// would be refused by the guard halfway, so the run is refused before it writes anything.
pub fn held_for_another(l: &LeaseSeen, window: &str, me: &str) -> Option<StopRefusal> {
    // Taken back, its label still names the window, and the guard still reads it.
    if l.window() != Some(window) && l.held_by.as_deref() != Some(window) {
        return None;
    }
    let op = l.operator.as_deref().unwrap_or("");
    (op != me).then(|| StopRefusal::ForAnotherOperator {
        lease: l.name.clone(),
        window: window.to_string(),
        operator: op.to_string(),
    })
}

// ---- Lease: take, prove, release ----

/// What taking one Lease comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakePlan {
    /// Write this merge patch; the former holder and its duration, to record.
    Take {
        patch: Value,
        former_holder: String,
        former_duration: i32,
    },
    /// This window holds it already (a re-run): what it recorded on the Lease.
    AlreadyHeld {
        former_holder: String,
        former_duration: i32,
    },
    Refuse(StopRefusal),
}

/// The take-over: the window's holder identity, a duration nobody sees expire, a transition
/// counted as client-go counts one, and the hold written onto the Lease (label, operator,
/// former holder and duration) so that the guard and a re-run read it there. The
/// `resourceVersion` makes it fail rather than overwrite a candidate that acquired since.
pub fn take_plan(l: &LeaseSeen, window: &str, operator: &str, now: Timestamp) -> TakePlan {
    match l.window() {
        Some(w) if w == window => {
            return TakePlan::AlreadyHeld {
                former_holder: l.former_holder.clone().unwrap_or_default(),
                former_duration: l.former_duration.unwrap_or(DEFAULT_LEASE_SECONDS),
            };
        }
        Some(w) => {
            return TakePlan::Refuse(StopRefusal::TakenByOther {
                lease: l.name.clone(),
                window: w.to_string(),
            });
        }
        None => {}
    }
    let former_duration = l.duration.unwrap_or(DEFAULT_LEASE_SECONDS).max(1);
    let at = micro_time(now);
    TakePlan::Take {
        patch: json!({
            "metadata": {
                "resourceVersion": l.resource_version,
                "labels": {HELD_BY_LABEL: window},
                "annotations": {
                    OPERATOR_ANNOTATION: operator,
                    FORMER_HOLDER_ANNOTATION: l.holder,
                    FORMER_DURATION_ANNOTATION: former_duration.to_string(),
                },
            },
            "spec": {
                "holderIdentity": holder_identity(window),
                "leaseDurationSeconds": HOLD_SECONDS,
                "acquireTime": at,
                "renewTime": at,
                "leaseTransitions": l.transitions.saturating_add(1),
            }
        }),
        former_holder: l.holder.clone(),
        former_duration,
    }
}

/// The release, as client-go's `release()` writes it (`tools/leaderelection/leaderelection.go`:
/// an empty holder, `leaseDurationSeconds: 1`, the transitions kept), with the hold taken off.
/// An empty holder is free to the first candidate that tries (`tryAcquireOrRenew`).
pub fn release_patch(l: &LeaseSeen, now: Timestamp) -> Value {
    let at = micro_time(now);
    let mut patch = strip_patch(l);
    patch["spec"] = json!({
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": at,
        "renewTime": at,
        "leaseTransitions": l.transitions,
    });
    patch
}

/// What is left of a hold taken back: the window's label and annotations, written off with
/// the `resourceVersion` read (a leader renewing meanwhile wins, and it is read again), `spec`
/// untouched: the holder keeps its Lease.
pub fn strip_patch(l: &LeaseSeen) -> Value {
    json!({
        "metadata": {
            "resourceVersion": l.resource_version,
            "labels": {HELD_BY_LABEL: null},
            "annotations": {
                OPERATOR_ANNOTATION: null,
                FORMER_HOLDER_ANNOTATION: null,
                FORMER_DURATION_ANNOTATION: null,
            },
        }
    })
}

// ---- Lease: a standby that keeps the webhooks served ----

/// Whether `open` adds a standby replica before it takes a Deployment's Leases. Cluster API
/// ships every provider with one replica, and a manager that loses its Lease exits
/// (controller-runtime `pkg/manager/internal.go`: "leader election lost"), so its webhooks
/// are gone until the kubelet restarts it, after CrashLoopBackOff's delay. A second pod,
/// Ready and not leading, keeps serving them. Not at 0 replicas (its owner stopped it), not
/// at 2 or more (a standby runs already), and once per window (the record says so).
pub fn needs_standby(replicas: i32, recorded: Option<&PinnedDeployment>) -> bool {
    replicas == 1 && !recorded.is_some_and(|p| p.standby && p.restored_at.is_none())
}

/// The count `close` scales a Deployment back to, before it releases the Lease, where `open`
/// added a standby: the recorded count, if the Deployment still runs exactly one more.
/// Anything else was changed by someone since, and is left as they set it.
pub fn standby_back(p: &PinnedDeployment, replicas_now: i32) -> Option<i32> {
    (p.standby && replicas_now == p.saved_replicas.saturating_add(1)).then_some(p.saved_replicas)
}

/// The pods of `deployment` to delete once its Leases are taken: the former leaders, named by
/// the holders they wrote, while another pod is Ready to serve the webhooks (`ready`, the
/// Deployment's Ready pods, counts the leader too). A deleted pod gets SIGTERM and drains its
/// webhook server (controller-runtime stops webhooks last, `pkg/manager/internal.go`), where a
/// leader left alone exits on "leader election lost" with its graceful shutdown skipped,
/// failing the requests it is serving, and restarts in CrashLoopBackOff.
pub fn leaders_to_delete(former_holders: &[String], deployment: &str, ready: i32) -> Vec<String> {
    let mut pods: Vec<String> = former_holders
        .iter()
        .filter_map(|h| pod_of_identity(h))
        .filter(|p| pod_of_deployment(p, deployment))
        .map(str::to_string)
        .collect();
    pods.sort();
    pods.dedup();
    // At least one Ready pod stays, whichever of these are Ready.
    match i32::try_from(pods.len()) {
        Ok(n) if ready - n >= 1 => pods,
        _ => vec![],
    }
}

/// Whether a Pod is one of `deployment`'s, by its owner: a ReplicaSet that the Deployment
/// controller names `<deployment>-<pod-template-hash>`, and whose name the pod's begins with.
/// The name alone could be another workload's (a StatefulSet `<deployment>-x` has a pod
/// `<deployment>-x-0`).
pub fn owned_by_deployment(pod: &str, owners: &[(String, String)], deployment: &str) -> bool {
    owners.iter().any(|(kind, rs)| {
        kind == "ReplicaSet"
            && rs
                .strip_prefix(deployment)
                .and_then(|h| h.strip_prefix('-'))
                .is_some_and(|h| !h.is_empty() && !h.contains('-'))
            && pod
                .strip_prefix(rs.as_str())
                .is_some_and(|r| r.starts_with('-'))
    })
}

/// When a former leader is proven stopped. client-go's `renew` (`leaderelection.go`) retries
/// each round for `RenewDeadline`, a round starting `RetryPeriod` after the last success, so a
/// leader that cannot renew stops leading within `RetryPeriod + RenewDeadline` of its last
/// renewal, which came before the take-over. The Lease records only `leaseDurationSeconds`;
/// handoff assumes, as the defaults of every provider it names do (2 s + 10 s ≤ 15 s, and
/// 5 s + 40 s ≤ 60 s for the kubeadm control plane), that the other two fit within it.
pub fn stopped_at(held_since: Timestamp, former_duration: i32) -> Timestamp {
    held_since
        .checked_add(SignedDuration::from_secs(i64::from(former_duration.max(0))))
        .unwrap_or(held_since)
}

/// The pod of `deployment` that leads with this Lease now, if one does.
pub fn leader_of<'a>(l: &'a LeaseSeen, deployment: &str) -> Option<&'a str> {
    pod_of_identity(&l.holder).filter(|p| pod_of_deployment(p, deployment))
}

/// `metav1.MicroTime` as the API server writes it.
pub fn micro_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

// ---- order ----

/// Restore order: the target first (the new management cluster takes over before the old one
/// wakes), then the source, then a cluster with no role.
pub fn close_order<T>(mut clusters: Vec<T>, role: impl Fn(&T) -> Option<MoveRole>) -> Vec<T> {
    let rank = |r: Option<MoveRole>| match r {
        Some(MoveRole::Target) => 0,
        Some(MoveRole::Source) => 1,
        None => 2,
    };
    clusters.sort_by_key(|c| rank(role(c)));
    clusters
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::move_window::HeldLease;

    fn lease(name: &str, holder: &str) -> LeaseSeen {
        LeaseSeen {
            name: name.into(),
            holder: holder.into(),
            duration: Some(15),
            transitions: 3,
            resource_version: Some("42".into()),
            ..LeaseSeen::default()
        }
    }

    const CAPI: &str = "capi-controller-manager";

    #[test]
    fn identities_name_pods_exactly() {
        assert_eq!(
            pod_of_identity("capi-controller-manager-7d9f8b6c4-x2k4j_0b8a1c2e-uuid"),
            Some("capi-controller-manager-7d9f8b6c4-x2k4j")
        );
        for bad in ["", "_x", "pod_", "no-underscore"] {
            assert_eq!(pod_of_identity(bad), None, "{bad}");
        }
        assert!(pod_of_deployment(
            "capi-controller-manager-7d9f8b6c4-x2k4j",
            CAPI
        ));
        for other in [
            "capi-controller-manager-extra-7d9f8b6c4-x2k4j",
            "capi-controller-manager-x2k4j",
            "capi-controller-manager",
            "capi-controller-manager--x2k4j",
            "capi-controller-managerx-7d9f8b6c4-x2k4j",
            "other-7d9f8b6c4-x2k4j",
        ] {
            assert!(!pod_of_deployment(other, CAPI), "{other}");
        }
    }

    #[test]
    fn a_lease_written_free_moments_ago_awaits_its_candidates() {
        let now: Timestamp = "2026-12-05T10:00:00Z".parse().unwrap();
        let at = |secs: i64| Some(now - SignedDuration::from_secs(secs));
        // Released 1 s ago: a candidate takes it at its next try; wait until 30 s after.
        let mut free = lease("controller-leader-election-capi", "");
        free.renewed = at(1);
        assert_eq!(
            awaits_candidate(&free, now),
            Some(now + SignedDuration::from_secs(29))
        );
        // Free for longer than any candidate's retry: no candidate is coming.
        free.renewed = at(30);
        assert_eq!(awaits_candidate(&free, now), None);
        // Held, by a pod or by a window, says whose it is already.
        let mut held = lease(
            "controller-leader-election-capi",
            "capi-controller-manager-7d9f8b6c4-x2k4j_u1",
        );
        held.renewed = at(1);
        assert_eq!(awaits_candidate(&held, now), None);
        held.holder = holder_identity("move");
        assert_eq!(awaits_candidate(&held, now), None);
        // Never renewed: nothing says when it was freed.
        free.renewed = None;
        assert_eq!(awaits_candidate(&free, now), None);
    }

    #[test]
    fn a_deployment_claims_only_the_leases_its_pods_hold() {
        let leases = [
            lease(
                "controller-leader-election-capi",
                "capi-controller-manager-7d9f8b6c4-x2k4j_u1",
            ),
            lease("extra", "capi-controller-manager-extra-5c6d7e8f9-abcde_u2"),
            lease("released", ""),
            lease("node", "node-1"),
            // A manager run outside the cluster: no Pod of any Deployment (the docs say so).
            lease("laptop", "laptop-of-an-operator_0a1b2c3d"),
        ];
        let got = claims(CAPI, &leases, "move");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0], Claim::Its(leases[0].clone()));
        let extra = claims("capi-controller-manager-extra", &leases, "move");
        assert_eq!(extra, vec![Claim::Its(leases[1].clone())]);

        // Held by a window: found through the former holder it recorded.
        let mut held = lease("controller-leader-election-capi", &holder_identity("move"));
        held.held_by = Some("move".into());
        held.former_holder = Some("capi-controller-manager-7d9f8b6c4-x2k4j_u1".into());
        assert_eq!(
            claims(CAPI, std::slice::from_ref(&held), "move"),
            vec![Claim::HeldHere(held.clone())]
        );
        assert_eq!(
            claims(CAPI, std::slice::from_ref(&held), "other"),
            vec![Claim::HeldElsewhere(held.clone(), "move".into())]
        );
        assert!(claims("capi-controller-manager-extra", &[held], "move").is_empty());
    }

    #[test]
    fn the_strategy_follows_the_leases_and_the_record() {
        let its = [Claim::Its(lease(
            "l",
            "capi-controller-manager-7d9f8b6c4-x2k4j_u1",
        ))];
        assert_eq!(
            choose_stop(StopPolicy::Auto, CAPI, None, &its),
            StopChoice::Lease(vec!["l".into()])
        );
        assert_eq!(
            choose_stop(StopPolicy::Auto, CAPI, None, &[]),
            StopChoice::Scale
        );
        assert_eq!(
            choose_stop(StopPolicy::Scale, CAPI, None, &its),
            StopChoice::Scale
        );
        assert!(matches!(
            choose_stop(StopPolicy::Lease, CAPI, None, &[]),
            StopChoice::Refuse(m) if m.to_string().contains("--stop")
        ));
        // A re-run keeps what the first run recorded.
        let scaled = PinnedDeployment {
            namespace: "capi-system".into(),
            name: CAPI.into(),
            saved_replicas: 2,
            ..PinnedDeployment::default()
        };
        assert_eq!(
            choose_stop(StopPolicy::Auto, CAPI, Some(&scaled), &its),
            StopChoice::Scale
        );
        let leased = PinnedDeployment {
            strategy: Some(Strategy::Lease),
            leases: vec![HeldLease {
                name: "recorded".into(),
                ..HeldLease::default()
            }],
            ..scaled.clone()
        };
        assert_eq!(
            choose_stop(StopPolicy::Scale, CAPI, Some(&leased), &its),
            StopChoice::Lease(vec!["l".into(), "recorded".into()])
        );
        // A restored record is history: chosen anew.
        let restored = PinnedDeployment {
            restored_at: Some("2026-12-01T00:00:00Z".into()),
            ..scaled
        };
        assert_eq!(
            choose_stop(StopPolicy::Auto, CAPI, Some(&restored), &its),
            StopChoice::Lease(vec!["l".into()])
        );
        let mut l = lease("l", &holder_identity("other"));
        l.held_by = Some("other".into());
        assert!(matches!(
            choose_stop(StopPolicy::Auto, CAPI, None, &[Claim::HeldElsewhere(l, "other".into())]),
            StopChoice::Refuse(m) if m.to_string().contains("\"other\"")
        ));
    }

    #[test]
    fn take_and_release_write_what_client_go_reads() {
        let now: Timestamp = "2026-12-01T08:00:00Z".parse().unwrap();
        let l = lease("l", "capi-controller-manager-7d9f8b6c4-x2k4j_u1");
        let TakePlan::Take {
            patch,
            former_holder,
            former_duration,
        } = take_plan(&l, "move", "alice", now)
        else {
            panic!("not a take")
        };
        assert_eq!(former_holder, l.holder);
        assert_eq!(former_duration, 15);
        assert_eq!(
            patch["spec"]["holderIdentity"],
            "handoff.dev/move-window/move"
        );
        assert_eq!(patch["spec"]["leaseDurationSeconds"], HOLD_SECONDS);
        assert_eq!(patch["spec"]["leaseTransitions"], 4);
        assert_eq!(patch["spec"]["renewTime"], "2026-12-01T08:00:00.000000Z");
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["metadata"]["labels"][HELD_BY_LABEL], "move");
        assert_eq!(
            patch["metadata"]["annotations"][OPERATOR_ANNOTATION],
            "alice"
        );
        assert_eq!(
            patch["metadata"]["annotations"][FORMER_DURATION_ANNOTATION],
            "15"
        );

        // Read back as the API server would store it: a re-run sees it held here.
        let mut held = lease("l", &holder_identity("move"));
        held.held_by = Some("move".into());
        held.former_holder = Some(l.holder.clone());
        held.former_duration = Some(15);
        assert_eq!(
            take_plan(&held, "move", "bob", now),
            TakePlan::AlreadyHeld {
                former_holder: l.holder.clone(),
                former_duration: 15
            }
        );
        assert!(matches!(
            take_plan(&held, "other", "bob", now),
            TakePlan::Refuse(_)
        ));

        let r = release_patch(&held, now);
        assert_eq!(r["spec"]["holderIdentity"], "");
        assert_eq!(r["spec"]["leaseDurationSeconds"], 1);
        assert_eq!(r["spec"]["leaseTransitions"], 3);
        assert!(r["metadata"]["labels"][HELD_BY_LABEL].is_null());
        assert!(r["metadata"]["annotations"][OPERATOR_ANNOTATION].is_null());
    }

    #[test]
    fn a_rerun_as_another_user_is_refused_before_it_writes() {
        let mut held = lease("l", &holder_identity("move"));
        held.held_by = Some("move".into());
        held.operator = Some("alice".into());
        assert_eq!(held_for_another(&held, "move", "alice"), None);
        assert!(
            held_for_another(&held, "move", "bob")
                .is_some_and(|m| m.to_string().contains("\"alice\""))
        );
        assert_eq!(held_for_another(&held, "other", "bob"), None);
        let free = lease("l", "capi-controller-manager-7d9f8b6c4-x2k4j_u1");
        assert_eq!(held_for_another(&free, "move", "bob"), None);
        // Taken back by a pod, labelled still: the guard still lets only alice write it.
        let mut back = held.clone();
        back.holder = free.holder.clone();
        assert!(held_for_another(&back, "move", "bob").is_some());
        assert_eq!(held_for_another(&back, "move", "alice"), None);
    }

    #[test]
    fn stopped_after_the_former_duration() {
        let t: Timestamp = "2026-12-01T08:00:00Z".parse().unwrap();
        assert_eq!(stopped_at(t, 60).to_string(), "2026-12-01T08:01:00Z");
        assert_eq!(stopped_at(t, -5), t);
        let mut l = lease("l", "capi-controller-manager-7d9f8b6c4-x2k4j_u1");
        assert_eq!(
            leader_of(&l, CAPI),
            Some("capi-controller-manager-7d9f8b6c4-x2k4j")
        );
        l.holder = String::new();
        assert_eq!(leader_of(&l, CAPI), None);
    }

    #[test]
    fn target_first_then_source() {
        let order = close_order(
            vec![
                (Some(MoveRole::Source), "s"),
                (None, "c"),
                (Some(MoveRole::Target), "t"),
            ],
            |c| c.0,
        );
        assert_eq!(
            order.iter().map(|c| c.1).collect::<Vec<_>>(),
            ["t", "s", "c"]
        );
    }

    #[test]
    fn a_hold_is_judged_by_its_holder_not_its_label() {
        let mut held = lease("l", &holder_identity("move"));
        held.held_by = Some("move".into());
        assert_eq!(held.window(), Some("move"));
        assert_eq!(held.taken_back(), None);
        // A provider acquired it since: client-go kept the label, the holder is the pod's.
        let mut back = held.clone();
        back.holder = "capi-controller-manager-7d9f8b6c4-x2k4j_u9".into();
        assert_eq!(back.window(), None);
        assert_eq!(
            back.taken_back(),
            Some(("move", "capi-controller-manager-7d9f8b6c4-x2k4j_u9"))
        );
        // So a re-run takes it again, from that pod, instead of calling it held.
        let now: Timestamp = "2026-12-01T08:00:00Z".parse().unwrap();
        assert!(matches!(
            take_plan(&back, "move", "alice", now),
            TakePlan::Take { former_holder, .. } if former_holder == back.holder
        ));
        // And it is its Deployment's again.
        assert_eq!(
            claims(CAPI, std::slice::from_ref(&back), "move"),
            vec![Claim::Its(back.clone())]
        );
        // Freed by hand and not yet acquired: taken back from the window, by nobody.
        let mut freed = held.clone();
        freed.holder = String::new();
        assert_eq!(freed.taken_back(), Some(("move", "")));
        let strip = strip_patch(&back);
        assert!(
            strip.get("spec").is_none(),
            "the holder keeps its Lease: {strip}"
        );
        assert!(strip["metadata"]["labels"][HELD_BY_LABEL].is_null());
        assert_eq!(strip["metadata"]["resourceVersion"], "42");
        // Unlabelled and held by a pod: not a window's at all.
        assert_eq!(lease("l", "pod-abc-def_u").taken_back(), None);
    }

    #[test]
    fn a_single_replica_gets_one_standby_and_gets_it_back() {
        let rec = |standby: bool, restored: bool| PinnedDeployment {
            saved_replicas: 1,
            standby,
            restored_at: restored.then(|| "2026-12-01T00:00:00Z".into()),
            ..PinnedDeployment::default()
        };
        assert!(needs_standby(1, None));
        assert!(!needs_standby(0, None), "stopped by its owner: stays at 0");
        assert!(!needs_standby(2, None), "a standby runs already");
        assert!(!needs_standby(1, Some(&rec(true, false))), "added once");
        assert!(
            needs_standby(1, Some(&rec(true, true))),
            "a restored record is history"
        );
        assert!(needs_standby(1, Some(&rec(false, false))));
        assert_eq!(standby_back(&rec(true, false), 2), Some(1));
        assert_eq!(
            standby_back(&rec(true, false), 3),
            None,
            "scaled by someone since"
        );
        assert_eq!(
            standby_back(&rec(true, false), 1),
            None,
            "not added (a run died before)"
        );
        assert_eq!(standby_back(&rec(false, false), 2), None);
    }

    #[test]
    fn the_former_leader_goes_only_while_another_pod_serves() {
        let holders = [
            "capi-controller-manager-7d9f8b6c4-x2k4j_u1".to_string(),
            "capi-controller-manager-7d9f8b6c4-x2k4j_u2".to_string(),
            "capi-controller-manager-extra-7d9f8b6c4-abcde_u3".to_string(),
            String::new(),
        ];
        assert_eq!(
            leaders_to_delete(&holders, CAPI, 2),
            ["capi-controller-manager-7d9f8b6c4-x2k4j"]
        );
        assert!(
            leaders_to_delete(&holders, CAPI, 1).is_empty(),
            "its only Ready pod stays"
        );
        assert!(
            leaders_to_delete(&[String::new()], CAPI, 3).is_empty(),
            "nobody led"
        );
        // Two Leases led by two pods, two Ready pods: deleting both would leave none.
        let two = [
            "capi-controller-manager-7d9f8b6c4-aaaaa_u1".to_string(),
            "capi-controller-manager-7d9f8b6c4-bbbbb_u2".to_string(),
        ];
        assert!(leaders_to_delete(&two, CAPI, 2).is_empty());
        assert_eq!(leaders_to_delete(&two, CAPI, 3).len(), 2);
        let rs = |k: &str, n: &str| vec![(k.to_string(), n.to_string())];
        let pod = "capi-controller-manager-7d9f8b6c4-x2k4j";
        assert!(owned_by_deployment(
            pod,
            &rs("ReplicaSet", "capi-controller-manager-7d9f8b6c4"),
            CAPI
        ));
        assert!(!owned_by_deployment(
            pod,
            &rs("StatefulSet", "capi-controller-manager-7d9f8b6c4"),
            CAPI
        ));
        assert!(!owned_by_deployment(
            pod,
            &rs("ReplicaSet", "capi-controller-manager-extra-7d9f8b6c4"),
            CAPI
        ));
        assert!(!owned_by_deployment(
            pod,
            &rs("ReplicaSet", "other-7d9f8b6c4"),
            CAPI
        ));
        assert!(!owned_by_deployment(pod, &[], CAPI));
    }

    #[test]
    fn restore_counts() {
        let rec = PinnedDeployment {
            saved_replicas: 4,
            ..PinnedDeployment::default()
        };
        assert_eq!(restore_count(Some("3"), Some(&rec)), (3, None));
        assert_eq!(restore_count(None, Some(&rec)), (4, None));
        assert_eq!(restore_count(Some("x"), None).0, 1);
        assert_eq!(restore_count(None, None).0, 1);
    }
}
