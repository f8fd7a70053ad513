//! Stopping by Lease in `handoff window open`: what is recorded before a Lease is taken, the
//! take-over of each, and when the former leaders are proven stopped.

use crate::window::progress::Progress;

use k8s_openapi::jiff::Timestamp;

use super::super::common::{Cluster, Result, now, record};
use super::super::lease;
use super::super::plan;
use super::super::standby;
use super::OpenOptions;
use super::choose::{Choice, Stop};
use crate::resources::move_window::{HeldLease, PinnedDeployment, Strategy};

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
                    .unwrap_or(plan::DEFAULT_LEASE_SECONDS),
                ..HeldLease::default()
            })
            .collect(),
        ..PinnedDeployment::default()
    })
}

/// Take every Lease of one Deployment and record each as it is taken.
pub async fn take_leases(
    c: &Cluster,
    opts: &OpenOptions,
    ch: &Choice,
    operator: &str,
    out: &mut Progress,
) -> Result<Vec<HeldLease>> {
    let Stop::Lease(leases) = &ch.plan else {
        return Ok(vec![]);
    };
    let mut held = Vec::new();
    let mut taken_from = Vec::new();
    for l in leases {
        let mut h = lease::take(c, &ch.namespace, &l.name, &opts.name, operator, out).await?;
        if h.held_since.is_some() {
            taken_from.push(h.former_holder.clone());
        }
        let status = record(c, &opts.name, |s| {
            if let Some(p) = s
                .pinned
                .iter_mut()
                .find(|p| p.namespace == ch.namespace && p.name == ch.name)
                && let Some(e) = p.leases.iter_mut().find(|e| e.name == l.name)
            {
                match &h.held_since {
                    // Taken now: the bound counts from this take-over, whatever an earlier
                    // (released) hold recorded.
                    Some(t) => {
                        e.held_since = Some(t.clone());
                        e.released_at = None;
                        e.leads_again = None;
                    }
                    // Held already (a re-run): the first take-over's time stands; if it was
                    // never recorded (a run that died between the write and the record),
                    // from now on: late, never early.
                    None => {
                        if e.held_since.is_none() || e.released_at.is_some() {
                            e.held_since = Some(now());
                            e.released_at = None;
                        }
                    }
                }
                e.former_holder = h.former_holder.clone();
                e.former_lease_duration_seconds = h.former_lease_duration_seconds;
                p.stopped_since = None;
            }
            s.last_step = Some(format!("took Lease {}/{}", ch.namespace, l.name));
        })
        .await?;
        if let Some(e) = status
            .pinned
            .iter()
            .find(|p| p.namespace == ch.namespace && p.name == ch.name)
            .and_then(|p| p.leases.iter().find(|e| e.name == l.name))
        {
            h = e.clone();
        }
        held.push(h);
    }
    // The former leader, while it has not yet noticed (its renew deadline): deleted, it
    // drains; left alone, it would exit mid-request.
    if !taken_from.is_empty() {
        let ready = standby::ready_pods(c, &ch.namespace, &ch.name)
            .await?
            .unwrap_or(0);
        for pod in plan::leaders_to_delete(&taken_from, &ch.name, ready) {
            if standby::delete_pod(c, &ch.namespace, &pod, &ch.name).await? {
                out.detail(format!("{}: deleted the former leader's Pod {}/{pod}: it drains its webhooks instead of exiting mid-request (its ReplicaSet replaces it)",
                    c.label, ch.namespace));
            }
        }
    }
    Ok(held)
}

/// When every former leader of these Leases is proven stopped.
pub fn proven_at(held: &[HeldLease]) -> Timestamp {
    held.iter()
        .map(|h| {
            // A take-over whose time was never recorded (a run that died between the write
            // and the record) counts from now: late, never early.
            let since = h
                .held_since
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .unwrap_or_else(Timestamp::now);
            match h.former_holder.is_empty() {
                // Released before we took it: nobody was leading.
                true => since,
                false => plan::stopped_at(since, h.former_lease_duration_seconds),
            }
        })
        .max()
        .unwrap_or_else(Timestamp::now)
}
