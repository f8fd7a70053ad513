//! Stopping by Lease in `handoff window open`: what is recorded before a Lease is taken, the
//! take-over of each, and when the former leaders are proven stopped.

use crate::window::progress::Progress;

use k8s_openapi::jiff::Timestamp;

use super::OpenOptions;
use super::choose::{Choice, Stop};
use crate::resources::move_window::{FormerPod, HeldLease, PinnedDeployment, Strategy};
use crate::window::cluster::lease;
use crate::window::cluster::pod_watch::PodWatch;
use crate::window::cluster::standby;
use crate::window::cluster::{Cluster, Result, now, record};
use crate::window::plan::proof::{self, Takeover};
use crate::window::plan::stop;

/// The record `open` writes for a Lease-stopped Deployment before it takes anything.
pub fn leased_record(ch: &Choice) -> Option<PinnedDeployment> {
    let Stop::Lease(leases) = &ch.plan else {
        return None;
    };
    Some(PinnedDeployment {
        namespace: ch.namespace.clone(),
        name: ch.name.clone(),
        strategy: Some(Strategy::Lease),
        saved_replicas: ch.replicas,
        leases: leases
            .iter()
            .map(|l| HeldLease {
                name: l.name.clone(),
                former_holder: l.former_holder.clone().unwrap_or_else(|| l.holder.clone()),
                former_lease_duration_seconds: l
                    .former_duration
                    .or(l.duration)
                    .unwrap_or(stop::DEFAULT_LEASE_SECONDS),
                ..HeldLease::default()
            })
            .collect(),
        ..PinnedDeployment::default()
    })
}

/// A Lease held by the window, and the watch of its former holder's Pod.
pub struct Held {
    pub lease: HeldLease,
    pub watch: Option<PodWatch>,
}

/// Take every Lease of one Deployment and record each as it is taken, with its former
/// holder's Pod as the kubelet reports it then; watch that Pod from then on (its end proves
/// the leader stopped); then delete it where another Pod is Ready.
pub async fn take_leases(
    c: &Cluster,
    opts: &OpenOptions,
    ch: &Choice,
    operator: &str,
    out: &mut Progress,
) -> Result<Vec<Held>> {
    let Stop::Lease(leases) = &ch.plan else {
        return Ok(vec![]);
    };
    let mut held = Vec::new();
    let mut taken_from = Vec::new();
    for l in leases {
        let h = lease::take(c, &ch.namespace, &l.name, &opts.name, operator, out).await?;
        // Read right after the take-over: the instance that led runs in it now, or ran before.
        let pod = match h.held_since {
            Some(_) => {
                taken_from.push(h.former_holder.clone());
                former_pod(c, &ch.namespace, &h.former_holder, &ch.name).await?
            }
            None => None,
        };
        let mut lease = record_taken(c, opts, ch, &l.name, h, pod).await?;
        // Fixed now, so that the bound does not move on with the clock while `prove` waits.
        lease.held_since.get_or_insert_with(now);
        let watch = match (&lease.former_pod, &lease.proof) {
            (Some(p), None) => Some(PodWatch::start(c, &ch.namespace, &p.name).await),
            _ => None,
        };
        held.push(Held { lease, watch });
    }
    // The former leader, while it has not yet noticed (its renew deadline): deleted, it
    // drains; left alone, it would exit mid-request.
    if !taken_from.is_empty() {
        let ready = standby::ready_pods(c, &ch.namespace, &ch.name)
            .await?
            .unwrap_or(0);
        for pod in stop::leaders_to_delete(&taken_from, &ch.name, ready) {
            if standby::delete_pod(c, &ch.namespace, &pod, &ch.name).await? {
                out.detail(format!("{}: deleted the former leader's Pod {}/{pod}: it drains its webhooks instead of exiting mid-request (its ReplicaSet replaces it)",
                    c.label, ch.namespace));
            }
        }
    }
    Ok(held)
}

/// The former holder's Pod, where it is one of the Deployment's with a running container.
async fn former_pod(
    c: &Cluster,
    ns: &str,
    holder: &str,
    deployment: &str,
) -> Result<Option<FormerPod>> {
    let Some(name) =
        stop::pod_of_identity(holder).filter(|p| stop::pod_of_deployment(p, deployment))
    else {
        return Ok(None);
    };
    Ok(standby::deployment_pod(c, ns, name, deployment)
        .await?
        .and_then(|p| proof::former_pod(&p)))
}

/// Record one Lease as held; returns it as recorded.
async fn record_taken(
    c: &Cluster,
    opts: &OpenOptions,
    ch: &Choice,
    lease: &str,
    h: HeldLease,
    pod: Option<FormerPod>,
) -> Result<HeldLease> {
    let status = record(c, &opts.name, |s| {
        if let Some(p) = s
            .pinned
            .iter_mut()
            .find(|p| p.namespace == ch.namespace && p.name == ch.name)
            && let Some(e) = p.leases.iter_mut().find(|e| e.name == lease)
        {
            match &h.held_since {
                // Taken now: the bound counts from this take-over, whatever an earlier
                // (released) hold recorded, and the proof is this take-over's.
                Some(t) => {
                    e.held_since = Some(t.clone());
                    e.released_at = None;
                    e.leads_again = None;
                    e.former_pod = pod.clone();
                    e.proof = None;
                }
                // Held already (a re-run): the first take-over's time stands; if it was
                // never recorded (a run that died between the write and the record),
                // from now on: late, never early; its Pod unknown, so the bound.
                None => {
                    if e.held_since.is_none() || e.released_at.is_some() {
                        e.held_since = Some(now());
                        e.released_at = None;
                        e.former_pod = None;
                        e.proof = None;
                    }
                }
            }
            e.former_holder = h.former_holder.clone();
            e.former_lease_duration_seconds = h.former_lease_duration_seconds;
            p.stopped_since = None;
        }
        s.last_step = Some(format!("took Lease {}/{lease}", ch.namespace));
    })
    .await?;
    Ok(status
        .pinned
        .iter()
        .find(|p| p.namespace == ch.namespace && p.name == ch.name)
        .and_then(|p| p.leases.iter().find(|e| e.name == lease))
        .cloned()
        .unwrap_or(h))
}

/// What the take-over recorded of a held Lease, for `proof::proof`.
pub fn takeover<'a>(h: &'a HeldLease, deployment: &'a str) -> Takeover<'a> {
    Takeover {
        held_since: held_since(h),
        lease_seconds: h.former_lease_duration_seconds,
        former_holder: &h.former_holder,
        deployment,
        pod: h.former_pod.as_ref(),
    }
}

/// When the window took it. A take-over whose time was never recorded (a run that died
/// between the write and the record) counts from now: late, never early.
pub fn held_since(h: &HeldLease) -> Timestamp {
    h.held_since
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or_else(Timestamp::now)
}

/// The latest moment these former leaders are proven stopped, whatever the kubelet reports:
/// their Leases' bounds.
pub fn bound(held: &[Held]) -> Timestamp {
    held.iter()
        .map(|h| {
            let since = held_since(&h.lease);
            match h.lease.former_holder.is_empty() {
                // Released before we took it: nobody was leading.
                true => since,
                false => stop::stopped_at(since, h.lease.former_lease_duration_seconds),
            }
        })
        .max()
        .unwrap_or_else(Timestamp::now)
}
