//! `prove`'s wait for the former leaders, and what it records: each Lease proven stopped by
//! the kubelet's report of its leader's end, or by its bound (`proof::proof` decides).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::Taken;
use super::by_lease::{Held, held_since, takeover};
use crate::resources::move_window::ProofKind;
use crate::resources::phase::WindowPhase;
use crate::window::cluster::{Result, now, pinned_mut, record};
use crate::window::plan::proof::{self, Proof, ProvenBy};
use crate::window::progress::Progress;

/// How often the watches' reports are read again (in memory: no request).
const TICK: Duration = Duration::from_millis(200);

/// Per `Taken`, per Lease-stopped Deployment, per Lease: when and how it was proven.
pub type Proofs = Vec<Vec<Vec<(Timestamp, ProvenBy)>>>;

/// A proof recorded by an earlier run stands.
fn recorded(h: &Held) -> Option<(Timestamp, ProvenBy)> {
    let p = h.lease.proof.as_ref()?;
    let at = p.at.parse().ok()?;
    let by = match p.by {
        ProofKind::Exited => ProvenBy::Exited,
        ProofKind::NobodyLed => ProvenBy::NobodyLed,
        ProofKind::LeaseBound => ProvenBy::Bound(p.reason.clone().unwrap_or_default()),
    };
    Some((at, by))
}

fn now_proof(h: &Held, deployment: &str, at: Timestamp) -> Proof {
    if let Some((at, by)) = recorded(h) {
        return Proof::Proven { at, by };
    }
    let reports = h.watch.as_ref().map(|w| w.reports()).unwrap_or_default();
    proof::proof(&takeover(&h.lease, deployment), &reports, at)
}

/// Until every former leader of every cluster is proven stopped.
pub async fn wait(taken: &[Taken], out: &mut Progress) -> Proofs {
    let mut said: Option<i64> = None;
    loop {
        let now = Timestamp::now();
        let all: Vec<Vec<Vec<Proof>>> = taken
            .iter()
            .map(|t| {
                t.leased
                    .iter()
                    .map(|(ch, held)| held.iter().map(|h| now_proof(h, &ch.name, now)).collect())
                    .collect()
            })
            .collect();
        let waiting: Vec<Timestamp> = all
            .iter()
            .flatten()
            .flatten()
            .filter_map(|p| match p {
                Proof::Wait { until, .. } => Some(*until),
                Proof::Proven { .. } => None,
            })
            .collect();
        let Some(last) = waiting.iter().max() else {
            return proven(all);
        };
        let left = last.duration_since(now).as_secs() + 1;
        match said {
            None => say_waiting(taken, waiting.len(), *last, out),
            Some(s) if s - left >= 10 => out.detail(format!(
                "waiting {left}s more at the most for the former leaders' ends ({} not yet reported)",
                waiting.len()
            )),
            Some(_) => {}
        }
        if said.is_none_or(|s| s - left >= 10) {
            said = Some(left);
        }
        tokio::time::sleep(TICK).await;
    }
}

fn say_waiting(taken: &[Taken], n: usize, last: Timestamp, out: &mut Progress) {
    let deployments: usize = taken.iter().map(|t| t.leased.len()).sum();
    let left = last.duration_since(Timestamp::now()).as_secs_f64().max(0.0);
    out.say(format!(
        "waiting for the former leaders of {deployments} Deployment{} to end ({n} not yet reported ended by the kubelet); the Lease bound proves it at the latest in {left:.0}s, at {last}",
        if deployments == 1 { "" } else { "s" },
    ));
}

fn proven(all: Vec<Vec<Vec<Proof>>>) -> Proofs {
    all.into_iter()
        .map(|t| {
            t.into_iter()
                .map(|d| {
                    d.into_iter()
                        .filter_map(|p| match p {
                            Proof::Proven { at, by } => Some((at, by)),
                            Proof::Wait { .. } => None,
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// How one Lease was proven, as a user reads it.
fn said(h: &Held, at: Timestamp, by: &ProvenBy) -> String {
    let since = held_since(&h.lease);
    let after = at.duration_since(since).as_secs_f64().max(0.0);
    match by {
        ProvenBy::NobodyLed => "nobody held it".to_string(),
        ProvenBy::Exited => {
            format!("its leader exited, reported by the kubelet {after:.1}s after the take-over")
        }
        ProvenBy::Bound(why) => format!(
            "Lease bound: {}s after the take-over, because {why}",
            h.lease.former_lease_duration_seconds
        ),
    }
}

/// Record each Lease's proof as soon as it holds (one write per cluster), and say it: the
/// end of a former leader is a fact whatever happens next, so a re-run after a Lease taken
/// back elsewhere, or a crash, keeps it instead of waiting for the bound.
pub async fn record_proofs(
    t: &Taken,
    proofs: &[Vec<(Timestamp, ProvenBy)>],
    out: &mut Progress,
) -> Result<()> {
    let c = &t.cluster;
    let mut records = Vec::new();
    for ((ch, held), proofs) in t.leased.iter().zip(proofs) {
        for (h, (at, by)) in held.iter().zip(proofs) {
            records.push((
                ch.namespace.clone(),
                ch.name.clone(),
                h.lease.name.clone(),
                by.record(*at),
            ));
        }
    }
    if records.is_empty() {
        return Ok(());
    }
    record(c, &t.opts.name, |s| {
        for (ns, name, lease, proof) in &records {
            if let Some(p) = pinned_mut(s, ns, name)
                && let Some(l) = p.leases.iter_mut().find(|l| &l.name == lease)
            {
                l.proof.get_or_insert_with(|| proof.clone());
            }
        }
        s.last_step = Some("proven".into());
    })
    .await?;
    for ((ch, held), proofs) in t.leased.iter().zip(proofs) {
        for (h, (at, by)) in held.iter().zip(proofs) {
            out.say(format!(
                "{}: {}: Lease {}: {}",
                c.label,
                ch.what(),
                h.lease.name,
                said(h, *at, by)
            ));
        }
    }
    Ok(())
}

/// Record each Deployment stopped since its last proof, and the window open (one write).
pub async fn record_proven(
    t: &Taken,
    proofs: &[Vec<(Timestamp, ProvenBy)>],
    out: &mut Progress,
) -> Result<()> {
    let c = &t.cluster;
    let since: Vec<(String, String, Timestamp)> = t
        .leased
        .iter()
        .zip(proofs)
        .map(|((ch, _), proofs)| {
            let at = proofs.iter().map(|(at, _)| *at).max();
            (
                ch.namespace.clone(),
                ch.name.clone(),
                at.unwrap_or_else(Timestamp::now),
            )
        })
        .collect();
    record(c, &t.opts.name, |s| {
        for (ns, name, at) in &since {
            if let Some(p) = pinned_mut(s, ns, name) {
                p.stopped_since.get_or_insert_with(|| at.to_string());
            }
        }
        s.phase = Some(WindowPhase::Open);
        if !t.opts.wait_timeout.is_zero() {
            s.pods_gone_at.get_or_insert_with(now);
        }
        s.last_step = Some("stopped".into());
    })
    .await?;
    if !t.leased.is_empty() {
        let what: Vec<String> = t.leased.iter().map(|(ch, _)| ch.what()).collect();
        out.say(format!(
            "{}: stopped and serving: {} (a Ready pod each)",
            c.label,
            what.join(", ")
        ));
    }
    out.say(format!("{}: MoveWindow {} is open", c.label, t.opts.name));
    Ok(())
}
