//! When a former leader is proven stopped, pure: from what the take-over recorded of the
//! process that led and what the API server has reported of its Pod since, either the moment
//! the kubelet reported that process ended, or the Lease's bound (`plan::stopped_at`) and why
//! nothing sooner holds.
//!
//! What the kubelet's report proves, from the Kubernetes sources (v1.36):
//! - A container ID reported `terminated` (as `state` or `lastState`) is an instance the
//!   runtime said has exited: `convertToAPIContainerStatuses` (`pkg/kubelet/kubelet_pods.go`)
//!   fills both from the runtime's status, and a new instance of a container starts only
//!   once the old one is not running (`computePodActions`,
//!   `pkg/kubelet/kuberuntime/kuberuntime_manager.go`). The exception is a state the kubelet
//!   invents when the runtime lost the container: reason `ContainerStatusUnknown`, exit 137,
//!   no container ID; it proves nothing and never counts.
//! - A gracefully deleted Pod is removed by the kubelet only after every container stopped,
//!   and its last status (each container `terminated`) is written before that delete
//!   (`pkg/kubelet/status/status_manager.go`: `TerminatePod`, `canBeDeleted`, `syncPod`), so a
//!   watch sees the end before the Pod's DELETED event, which carries that status too.
//! - A Pod removed otherwise carries no such report: a force delete (grace 0), the API
//!   server's shortcut for a Pod with no node or already Failed/Succeeded
//!   (`pkg/registry/core/pod/strategy.go`, `CheckGracefulDelete`), pod GC
//!   (`pkg/controller/podgc/gc_controller.go`: phase Failed, then a delete with grace 0). Such
//!   a Pod's process may outlive its object (a partitioned node), so only the bound holds.
//!
//! The process that led ran in one of the Pod's containers at the take-over: the instance the
//! kubelet reported running right after it, or one before it (which ended before that one
//! started). So the end of every instance recorded then proves the leader's end, with two
//! guards against a status that lagged the runtime: every container must be reported running
//! at that read, and a report that proves the end must show no instance running that started
//! before the take-over (one the read did not show).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::resources::move_window::{FormerPod, ProofKind, StopProof};
use crate::window::plan::stop;

/// How much later than the take-over an instance running in a proving report must have
/// started (the node's clock against this one's): one that started earlier may be one the
/// take-over's read did not show.
const STARTED_AFTER: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(5);

/// The reason the kubelet gives a container whose end it could not observe.
pub const UNKNOWN_END: &str = "ContainerStatusUnknown";

/// What the take-over recorded of a Lease's former leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover<'a> {
    pub held_since: Timestamp,
    /// `leaseDurationSeconds` then: the bound.
    pub lease_seconds: i32,
    /// `<pod>_<uuid>`; empty where nobody held it.
    pub former_holder: &'a str,
    /// The Deployment whose Pod it was to be.
    pub deployment: &'a str,
    /// Its Pod as read right after the take-over, where the holder was a Pod of the
    /// Deployment with a running container.
    pub pod: Option<&'a FormerPod>,
}

/// One report of the former leader's Pod, in the order the API server gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodReport {
    /// The Pod as reported at `at`: a watch event (a DELETED one carries the last status), or
    /// a read.
    Status {
        at: Timestamp,
        uid: String,
        /// Every container instance reported ended: its ID and the kubelet's reason.
        ended: Vec<(String, Option<String>)>,
        /// When each instance reported running started (`None`: not said).
        running: Vec<Option<Timestamp>>,
    },
    /// No Pod of that name any more (deleted, or found missing).
    Gone { at: Timestamp },
}

/// How a former leader is proven stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvenBy {
    /// Nobody held the Lease at the take-over.
    NobodyLed,
    /// The kubelet reported every instance that could have led ended.
    Exited,
    /// Its Lease's bound passed; why nothing sooner held.
    Bound(String),
}

impl ProvenBy {
    /// As the window records it.
    pub fn record(&self, at: Timestamp) -> StopProof {
        let (by, reason) = match self {
            ProvenBy::NobodyLed => (ProofKind::NobodyLed, None),
            ProvenBy::Exited => (ProofKind::Exited, None),
            ProvenBy::Bound(why) => (ProofKind::LeaseBound, Some(why.clone())),
        };
        StopProof {
            by,
            at: at.to_string(),
            reason,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    Proven {
        at: Timestamp,
        by: ProvenBy,
    },
    /// Not yet: the bound, and why the kubelet's report has not proven it (so far).
    Wait {
        until: Timestamp,
        why: String,
    },
}

/// The proof of one former leader as of `now`.
pub fn proof(t: &Takeover, reports: &[PodReport], now: Timestamp) -> Proof {
    if t.former_holder.is_empty() {
        return Proof::Proven {
            at: t.held_since,
            by: ProvenBy::NobodyLed,
        };
    }
    let bound = stop::stopped_at(t.held_since, t.lease_seconds);
    let (exited, why) = match t.pod {
        None => (None, no_pod(t.former_holder, t.deployment)),
        Some(pod) => exited(pod, t.held_since, reports),
    };
    match exited {
        // Reported no earlier than the take-over (its clock rounds up to the second).
        Some(at) if at <= bound => Proof::Proven {
            at: at.max(t.held_since),
            by: ProvenBy::Exited,
        },
        _ if now >= bound => Proof::Proven {
            at: bound,
            by: ProvenBy::Bound(why),
        },
        _ => Proof::Wait { until: bound, why },
    }
}

fn no_pod(holder: &str, deployment: &str) -> String {
    match stop::pod_of_identity(holder).filter(|p| stop::pod_of_deployment(p, deployment)) {
        None => format!(
            "its holder {holder} is no Pod of Deployment {deployment} (a manager run outside the cluster?)"
        ),
        Some(pod) => format!(
            "its Pod {pod} was gone, or had no running container, right after the take-over"
        ),
    }
}

/// When the reports first show every recorded instance ended, or why they do not.
fn exited(
    pod: &FormerPod,
    held_since: Timestamp,
    reports: &[PodReport],
) -> (Option<Timestamp>, String) {
    let mut why = format!("the kubelet has not reported Pod {} ended", pod.name);
    for r in reports {
        match r {
            PodReport::Status {
                at,
                uid,
                ended,
                running,
            } if *uid == pod.uid => {
                let all = pod.container_ids.iter().all(|id| {
                    ended
                        .iter()
                        .any(|(e, reason)| e == id && reason.as_deref() != Some(UNKNOWN_END))
                });
                // An instance running since before the take-over is one the read right after it
                // did not show (a status that lagged the runtime): it may be the leader.
                let fresh = running
                    .iter()
                    .all(|s| s.is_some_and(|s| s >= held_since + STARTED_AFTER));
                if all && fresh {
                    return (Some(*at), String::new());
                }
            }
            // Another Pod of that name: nothing about this one.
            PodReport::Status { .. } => {}
            PodReport::Gone { .. } => {
                why = format!(
                    "its Pod {} went with no report of its containers ending (a force delete, or pod GC)",
                    pod.name
                );
            }
        }
    }
    (None, why)
}

/// How a Lease's former leader is expected to be proven stopped, for a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Which proof, and what it waits for.
    pub said: String,
    /// The seconds after the take-over it is expected within.
    pub within: i64,
}

/// How a Lease's former leader is expected to be proven stopped, for a dry run: `deleted`,
/// whether its Pod will be deleted after the take-over (another Pod is Ready).
pub fn expected(
    holder: &str,
    deployment: &str,
    deleted: bool,
    grace: i64,
    lease_seconds: i32,
) -> Expected {
    let bound = i64::from(lease_seconds);
    let (said, within) = if holder.is_empty() {
        ("nobody leads: proven at once".into(), 0)
    } else {
        match stop::pod_of_identity(holder).filter(|p| stop::pod_of_deployment(p, deployment)) {
            None => (
                format!(
                    "proven by its Lease bound, {lease_seconds}s: its holder is not one of the Deployment's Pods"
                ),
                bound,
            ),
            Some(_) if deleted => (
                format!(
                    "proven when the kubelet reports its leader's Pod ended: deleted, it has {grace}s to end (terminationGracePeriodSeconds); at the latest the Lease bound, {lease_seconds}s"
                ),
                grace.max(0).min(bound),
            ),
            // It notices the Lease lost within its renew deadline, which only it knows.
            Some(_) => (
                format!(
                    "proven when the kubelet reports its leader restarted, once it notices the Lease lost (its renew deadline); at the latest the Lease bound, {lease_seconds}s"
                ),
                bound,
            ),
        }
    };
    Expected { said, within }
}

/// What the take-over records of the former leader's Pod: its UID and the instances the
/// kubelet reports running (none running: nothing to wait for the end of, so nothing proven).
pub fn former_pod(pod: &Pod) -> Option<FormerPod> {
    let name = pod.metadata.name.clone()?;
    let uid = pod.metadata.uid.clone()?;
    let all: Vec<&ContainerStatus> = statuses(pod).collect();
    let container_ids: Vec<String> = all
        .iter()
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .filter_map(|c| c.container_id.clone())
        .collect();
    // Every container running, each under its ID: one that is not may be where the leader
    // ran, in an instance the report has not caught up with.
    (!container_ids.is_empty() && container_ids.len() == all.len()).then_some(FormerPod {
        name,
        uid,
        container_ids,
    })
}

/// A Pod as reported at `at`.
pub fn report(pod: &Pod, at: Timestamp) -> PodReport {
    let mut ended = Vec::new();
    let mut running = Vec::new();
    for c in statuses(pod) {
        if let Some(r) = c.state.as_ref().and_then(|s| s.running.as_ref()) {
            running.push(r.started_at.as_ref().map(|t| t.0));
        }
        for s in [c.state.as_ref(), c.last_state.as_ref()]
            .into_iter()
            .flatten()
        {
            if let Some(t) = &s.terminated
                && let Some(id) = &t.container_id
            {
                ended.push((id.clone(), t.reason.clone()));
            }
        }
    }
    PodReport::Status {
        at,
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        ended,
        running,
    }
}

/// The regular containers: the manager runs in one (an init container has ended before any
/// of them starts).
fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
}

#[cfg(test)]
mod tests;
