//! The MoveWindow custom resource (`movewindows.handoff.dev/v1alpha1`, cluster-scoped).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// The default is a rule's fact (what a window selects when it says nothing), so it lives with
// the rules; re-exported here, where the window's type is.
pub use crate::rules::selector::default_deployment_selector;
use crate::rules::selector::{Selector, SelectorError};

pub use super::phase::{MovePhase, WindowPhase};

/// While `spec.state` is `Open`, every selected controller Deployment is stopped: its
/// leader-election Lease held by the window (its webhooks keep serving), or, where it holds no
/// Lease, pinned to zero replicas with the count it asked for kept in
/// `handoff.dev/replicas-before-move`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "handoff.dev",
    version = "v1alpha1",
    kind = "MoveWindow",
    plural = "movewindows",
    singular = "movewindow",
    shortname = "mw",
    status = "MoveWindowStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".spec.state"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#,
    printcolumn = r#"{"name":"Pinned","type":"integer","jsonPath":".status.pinnedCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MoveWindowSpec {
    /// `Open` pins the selected Deployments; `Closed` lets them run.
    pub state: WindowState,
    /// The controller Deployments to pin. Empty: Cluster API provider controllers
    /// (`clusterctl.cluster.x-k8s.io`, `cluster.x-k8s.io/provider`, and
    /// `clusterctl.cluster.x-k8s.io/core` not in cert-manager, inventory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_selector: Option<LabelSelector>,
    /// Why the window is open, for whoever finds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// This cluster's role in the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<MoveRole>,
    /// How `handoff window open` stops each selected Deployment: `Auto` (the default) holds
    /// the leader-election Lease its pods hold or last held and pins the others to 0;
    /// `Lease` refuses a Deployment without one; `Scale` pins every one to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopPolicy>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum StopPolicy {
    #[default]
    Auto,
    Lease,
    Scale,
}

/// How one Deployment is stopped, as `open` chose it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum Strategy {
    /// Pinned to 0 replicas, the count kept (also what a record without a strategy means:
    /// windows opened before the Lease strategy existed).
    #[default]
    Scale,
    /// Its leader-election Lease(s) held by the window: no replica reconciles, every replica
    /// serves its webhooks.
    Lease,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum WindowState {
    Open,
    Closed,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MoveRole {
    Source,
    Target,
}

/// What `handoff window` and `handoff move` have done: written by them, read by a re-run,
/// `window status` and `kubectl get`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoveWindowStatus {
    /// `Opening`, `Open` (every pinned pod gone), `Closing`, `Closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub phase: Option<WindowPhase>,
    /// RFC 3339 time the window was opened by `handoff window open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at: Option<String>,
    /// RFC 3339 time its pods were all gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_gone_at: Option<String>,
    /// RFC 3339 time `handoff window close` closed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<String>,
    /// Number of entries in `pinned` (for `kubectl get`).
    #[serde(default)]
    pub pinned_count: i32,
    /// Each Deployment the window stopped, and how.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<PinnedDeployment>,
    /// The last step a `handoff window` command completed, for a re-run to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<String>,
    /// The user `open` ran as (from a SelfSubjectReview): the only one the held Leases'
    /// guard lets change or delete them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// On the target's window: what `handoff move` has done and seen, for a re-run (or
    /// `--abort`) to pick up from, even after handoff itself died.
    #[serde(default, rename = "move", skip_serializing_if = "Option::is_none")]
    pub move_record: Option<MoveRecord>,
}

/// One `handoff move`, as recorded on the target's MoveWindow.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoveRecord {
    /// `Stopping target`, `Moving` (clusterctl runs), `Stopping source`, `Copying`,
    /// `Restoring`, `Failed`, `Done`, `Aborted`.
    #[schemars(with = "String")]
    pub phase: MovePhase,
    /// The source namespace clusterctl moves (`--namespace`).
    pub namespace: String,
    /// When this attempt started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// How many attempts there were.
    #[serde(default)]
    pub attempts: i32,
    /// Source Clusters (`namespace/name`) in scope when the move started; none was paused
    /// then (a move refuses to start otherwise), so one paused since was paused by clusterctl.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// Source ClusterClasses (`namespace/name`) of the namespace, none paused then;
    /// clusterctl pauses them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_classes: Vec<String>,
    /// Source Clusters (`namespace/name`) that carry handoff's block-move now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_move: Vec<String>,
    /// Source Clusters that were not paused when the move started and that handoff saw
    /// paused afterwards: clusterctl paused them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paused_by_clusterctl: Vec<String>,
    /// clusterctl's exit code, once it exited (`-1`: killed by a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusterctl_exit: Option<i32>,
    /// When handoff first took the target's controllers in this move (RFC 3339), kept across
    /// re-runs: the summary counts the target's stop from here to `targetBackAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_stopped_at: Option<String>,
    /// When handoff first took the source's controllers in this move (RFC 3339), kept across
    /// re-runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_stopped_at: Option<String>,
    /// When the target's controllers ran again after the move (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_back_at: Option<String>,
    /// When the source's controllers ran again after the move (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_back_at: Option<String>,
    /// What went wrong, for `status` and a re-run to show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A whole management cluster's move (`--all-namespaces`): every namespace, in the order
    /// clusterctl moves them, and where each is. Empty for a move of one namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceMove>,
}

/// One namespace of a whole management cluster's move.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceMove {
    pub name: String,
    pub state: NamespaceMoveState,
}

/// Where one namespace of a whole move is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NamespaceMoveState {
    /// Not yet begun.
    Pending,
    /// clusterctl was started on it and has not been seen to end well.
    Copying,
    /// clusterctl moved it.
    Moved,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedDeployment {
    /// The Deployment's namespace.
    pub namespace: String,
    /// The Deployment's name.
    pub name: String,
    /// `Scale` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// Scale: the count it will be restored to. Lease: the count it ran at (restored after a
    /// standby).
    pub saved_replicas: i32,
    /// Lease: `open` added one replica as a standby (Ready, not leading) before it took the
    /// Leases, so that the webhooks keep a pod; `close` scales back to `savedReplicas` before
    /// it releases them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
    /// Lease: the leader-election Leases the window holds for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<HeldLease>,
    /// Lease: when every former leader can no longer be leading (the latest
    /// `heldSince + formerLeaseDurationSeconds`), once `open` has waited for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_since: Option<String>,
    /// Set once `close` has restored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<String>,
    /// What `close` had to assume, if anything (a missing or unreadable annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl PinnedDeployment {
    pub fn strategy(&self) -> Strategy {
        self.strategy.unwrap_or_default()
    }
}

/// A leader-election Lease a window holds (`coordination.k8s.io/v1`, in the Deployment's
/// namespace).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeldLease {
    /// The Lease's name.
    pub name: String,
    /// `spec.holderIdentity` before the window took it (`<pod>_<uuid>`).
    pub former_holder: String,
    /// Its `spec.leaseDurationSeconds` then: how long a leader that cannot renew may go on
    /// believing it leads (client-go's bound).
    pub former_lease_duration_seconds: i32,
    /// When the window's holder identity was written (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_since: Option<String>,
    /// When `close` wrote it free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
    /// The pod that leads with it again after the release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leads_again: Option<String>,
    /// The former holder's Pod, as the kubelet reported it right after the take-over: what its
    /// end is proven by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub former_pod: Option<FormerPod>,
    /// How the former holder was proven stopped, once `open` has proven it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<StopProof>,
}

/// The Pod a Lease's former holder ran in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FormerPod {
    /// The Pod's name (the holder identity's `<pod>`).
    pub name: String,
    /// Its `metadata.uid`: a later Pod of the same name proves nothing about this one.
    pub uid: String,
    /// The container instances the kubelet reported running (`containerID`): the leader ran
    /// in one of them, or in one that ended before.
    #[serde(rename = "containerIDs")]
    pub container_ids: Vec<String>,
}

/// How a former holder was proven stopped.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopProof {
    /// `Exited`: the kubelet reported its end; `LeaseBound`: its lease duration passed;
    /// `NobodyLed`.
    pub by: ProofKind,
    /// When (RFC 3339).
    pub at: String,
    /// `LeaseBound`: why nothing sooner held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What proved a former holder stopped.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProofKind {
    /// The kubelet reported every container instance it could have led in ended.
    Exited,
    /// Its `leaseDurationSeconds` passed since the take-over.
    LeaseBound,
    /// Nobody held the Lease.
    NobodyLed,
}

impl MoveWindowSpec {
    pub fn is_open(&self) -> bool {
        self.state == WindowState::Open
    }

    /// The Cluster API default, compiled.
    pub fn default_selector() -> Selector {
        crate::rules::selector::default_selector().clone()
    }

    /// The selector in force: the spec's, or the Cluster API default when it is empty.
    pub fn selector(&self) -> Result<Selector, SelectorError> {
        match &self.deployment_selector {
            Some(s)
                if s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                    || s.match_expressions.as_ref().is_some_and(|m| !m.is_empty()) =>
            {
                Selector::from_label_selector(s)
            }
            _ => Selector::from_label_selector(&default_deployment_selector()),
        }
    }
}

/// The CRD, with one change to what kube derives: an optional enum (`role`, `stop`) is neither
/// `nullable` nor lists `null` among its values. kube writes both for an `Option` of an enum,
/// and kube-apiserver (v1.36) still refuses an explicit `null` there ("Unsupported value: null:
/// supported values: …, \"null\""), on create, JSON patch and server-side apply alike. A field
/// that is not nullable has its `null` pruned before validation (the CRD docs, "Defaulting
/// and Nullable"), so a client that writes `role: null` (a JSON pipeline, a GitOps tool)
/// gets the field absent, which is what `None` means.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt as _;
    let mut value = serde_json::to_value(MoveWindow::crd()).expect("the CRD serializes");
    absent_not_null(&mut value);
    serde_json::from_value(value).expect("the CRD deserializes")
}

/// Every schema whose `enum` lists `null`: drop that value and `nullable`.
fn absent_not_null(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Array(values)) = map.get_mut("enum")
                && values.iter().any(serde_json::Value::is_null)
            {
                values.retain(|x| !x.is_null());
                map.remove("nullable");
            }
            map.values_mut().for_each(absent_not_null);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(absent_not_null),
        _ => {}
    }
}

/// The CRD as YAML, exactly as `manifests/base/movewindow-crd.yaml` holds it.
pub fn crd_yaml() -> String {
    let header = "# Generated by `handoff crd` from src/resources/move_window.rs; a test fails when they drift.\n";
    format!(
        "{header}{}",
        crate::yaml::to_string(&crd()).expect("the CRD serializes")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_selector_picks_capi_providers_only() {
        let spec = MoveWindowSpec {
            state: WindowState::Open,
            deployment_selector: None,
            reason: None,
            role: None,
            stop: None,
        };
        let sel = spec.selector().unwrap();
        let l = |p: &[(&str, &str)]| {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let core = l(&[
            ("clusterctl.cluster.x-k8s.io", ""),
            ("cluster.x-k8s.io/provider", "cluster-api"),
        ]);
        assert!(sel.matches(Some(&core)));
        let cert_manager = l(&[
            ("clusterctl.cluster.x-k8s.io", ""),
            ("cluster.x-k8s.io/provider", "cert-manager"),
            ("clusterctl.cluster.x-k8s.io/core", "cert-manager"),
        ]);
        assert!(!sel.matches(Some(&cert_manager)));
        assert!(!sel.matches(Some(&l(&[("cluster.x-k8s.io/provider", "x")]))));
        // An explicitly empty selector also means the default, never "everything".
        let empty = MoveWindowSpec {
            deployment_selector: Some(LabelSelector::default()),
            ..spec
        };
        assert_eq!(empty.selector().unwrap(), sel);
    }
}

#[cfg(test)]
mod crd_drift {
    /// `manifests/base/movewindow-crd.yaml` is what `handoff crd` prints: regenerate it with
    /// `cargo run -- crd > manifests/base/movewindow-crd.yaml` when the type changes.
    #[test]
    fn manifest_matches_the_rust_type() {
        let file = include_str!("../../manifests/base/movewindow-crd.yaml");
        assert_eq!(
            file,
            super::crd_yaml(),
            "manifests/base/movewindow-crd.yaml drifted from MoveWindow; run `cargo run -- crd > manifests/base/movewindow-crd.yaml`"
        );
    }
}
