//! A window's Lease-stopped Deployments back: their standbys gone, every Lease the window
//! holds released, and a pod of each leading again.

use crate::window::progress::Progress;
use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use super::{CloseOptions, Restored, who};
use crate::resources::move_window::{HeldLease, MoveWindowStatus, PinnedDeployment, Strategy};
use crate::window::cluster::lease;
use crate::window::cluster::standby;
use crate::window::cluster::{Cluster, Result, WindowError, api_err, now, pinned_mut, record};
use crate::window::plan::stop;

/// What releasing one Deployment's Leases found: the Leases released or found free, its
/// replicas now (`None`: gone), and the Leases someone took back while the window held them.
struct Released<'a> {
    p: &'a PinnedDeployment,
    names: BTreeSet<String>,
    replicas: Option<i32>,
    taken_back: Vec<String>,
}

/// Release every Lease the window holds on this cluster, then wait until a pod of each
/// Deployment leads again.
pub async fn release_leases(
    c: &Cluster,
    opts: &CloseOptions,
    status: &MoveWindowStatus,
    out: &mut Progress,
) -> Result<Vec<Restored>> {
    let entries: Vec<&PinnedDeployment> = status
        .pinned
        .iter()
        .filter(|p| p.strategy() == Strategy::Lease && p.restored_at.is_none())
        .collect();
    standbys_back(c, opts, &entries, out).await?;
    let mut released = Vec::new();
    for p in &entries {
        released.push(release_one(c, opts, p, out).await?);
    }
    // Every Lease free, then the wait: the candidates of all of them try at once.
    let start = tokio::time::Instant::now();
    let mut restored = Vec::new();
    let mut left: Vec<String> = Vec::new();
    for r in released {
        if let Some(back) = wait_leading(c, opts, r, start, &mut left, out).await? {
            restored.push(back);
        }
    }
    if !left.is_empty() {
        return Err(WindowError::Timeout {
            cluster: c.label.into(),
            after: opts.lead_timeout,
            what: format!(
                "waiting for a pod to lead again: {} (the Leases are free; are its pods running? `kubectl get pods` and their logs tell)",
                left.join(", ")
            ),
        });
    }
    Ok(restored)
}

/// The standbys `open` added go before any Lease is free, all at once: the pod that stays
/// then leads, instead of one that the scale-down might stop while it leads.
async fn standbys_back(
    c: &Cluster,
    opts: &CloseOptions,
    entries: &[&PinnedDeployment],
    out: &mut Progress,
) -> Result<()> {
    let mut back = Vec::new();
    for p in entries {
        if let Some(count) = scale_back_standby(c, p, opts, out).await? {
            back.push((*p, count));
        }
    }
    let scaled: Vec<String> = back
        .iter()
        .filter(|(p, count)| *count == p.saved_replicas)
        .map(|(p, count)| format!("{}/{} ({count})", p.namespace, p.name))
        .collect();
    if !scaled.is_empty() {
        out.say(format!(
            "{}: the standbys go, back to: {}",
            c.label,
            scaled.join(", ")
        ));
    }
    for (p, count) in back {
        if let standby::Proof::Unreported(why) = standby::wait_settled(
            c,
            &p.namespace,
            &p.name,
            count,
            opts.lead_timeout,
            opts.poll,
        )
        .await?
        {
            out.warn(format!(
                "{why}; releasing its Lease without knowing that the pod that stays is Ready"
            ));
        }
        record(c, &opts.name, |s| {
            if let Some(e) =
                pinned_mut(s, &p.namespace, &p.name).filter(|e| e.restored_at.is_none())
            {
                e.standby = false;
            }
            s.last_step = Some(format!("standby of {}/{} removed", p.namespace, p.name));
        })
        .await?;
    }
    Ok(())
}

/// Release one Deployment's Leases: the recorded ones, and any other the window holds for it
/// (a run that died between a take and its record).
async fn release_one<'a>(
    c: &Cluster,
    opts: &CloseOptions,
    p: &'a PinnedDeployment,
    out: &mut Progress,
) -> Result<Released<'a>> {
    let (ns, name) = (p.namespace.as_str(), p.name.as_str());
    let mut names: BTreeSet<String> = p.leases.iter().map(|l| l.name.clone()).collect();
    for claim in stop::claims(name, &lease::leases_in(c, ns).await?, &opts.name) {
        if let stop::Claim::HeldHere(l) = claim {
            names.insert(l.name);
        }
    }
    let mut taken_back = Vec::new();
    for l in &names {
        let released = lease::release(c, ns, l, &opts.name).await?;
        record_released(c, opts, ns, name, l).await?;
        match &released {
            // Said with the pod that leads again.
            lease::Released::Freed => {}
            lease::Released::AlreadyFree => {
                out.detail(format!("{}: Lease {ns}/{l} already released", c.label));
            }
            lease::Released::TakenBack(holder) => {
                taken_back.push(format!(
                    "Lease {l} was taken back by {} while the window held it",
                    who(holder)
                ));
                {
                    out.warn(format!("{}: Lease {ns}/{l} was taken back by {} while MoveWindow {} held it: not written free over it (its controllers may have run during the window; handoff's label is removed)",
                    c.label,
                    who(holder),
                    opts.name));
                }
            }
        }
    }
    let replicas = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?
        .map(|d| d.spec.and_then(|s| s.replicas).unwrap_or(1));
    Ok(Released {
        p,
        names,
        replicas,
        taken_back,
    })
}

async fn record_released(
    c: &Cluster,
    opts: &CloseOptions,
    ns: &str,
    name: &str,
    l: &str,
) -> Result<()> {
    record(c, &opts.name, |s| {
        if let Some(e) = pinned_mut(s, ns, name) {
            match e.leases.iter_mut().find(|h| h.name == l) {
                Some(h) => {
                    h.released_at.get_or_insert_with(now);
                }
                None => e.leases.push(HeldLease {
                    name: l.to_string(),
                    released_at: Some(now()),
                    ..HeldLease::default()
                }),
            }
        }
        s.last_step = Some(format!("released Lease {ns}/{l}"));
    })
    .await
    .map(|_| ())
}

/// Wait until a pod of the Deployment leads each of its Leases again (none where it is gone
/// or runs no replica), then record it restored. `None` where the wait timed out (`left`
/// names it).
async fn wait_leading(
    c: &Cluster,
    opts: &CloseOptions,
    r: Released<'_>,
    start: tokio::time::Instant,
    left: &mut Vec<String>,
    out: &mut Progress,
) -> Result<Option<Restored>> {
    let (ns, name) = (r.p.namespace.as_str(), r.p.name.as_str());
    let what = format!("{ns}/{name}");
    let gone = match r.replicas {
        None => Some("Deployment no longer exists".to_string()),
        Some(0) => Some("runs 0 replicas: no pod can lead".to_string()),
        Some(_) => None,
    };
    let waits = gone.is_none() && opts.wait_leading;
    let note = match (gone, r.taken_back.is_empty()) {
        (Some(n), _) => Some(n),
        (None, false) => Some(r.taken_back.join("; ")),
        (None, true) => None,
    };
    let mut leaders = Vec::new();
    if waits {
        for l in &r.names {
            match leader_by(c, opts, ns, l, name, start).await? {
                Some(pod) => leaders.push((l.clone(), pod)),
                None => left.push(format!("{what} (Lease {l})")),
            }
        }
        if leaders.len() < r.names.len() {
            return Ok(None);
        }
    }
    record(c, &opts.name, |s| {
        if let Some(e) = pinned_mut(s, ns, name) {
            for h in e.leases.iter_mut() {
                if let Some((_, pod)) = leaders.iter().find(|(l, _)| *l == h.name) {
                    h.leads_again = Some(pod.clone());
                }
            }
            e.restored_at = Some(now());
            e.note = note.clone();
        }
        s.last_step = Some(match waits {
            true => format!("{what} leads again"),
            false => format!("{what} released"),
        });
    })
    .await?;
    let pods: Vec<&str> = leaders.iter().map(|(_, p)| p.as_str()).collect();
    match (&note, waits) {
        (Some(n), false) => {
            out.say(format!("{}: released {what}: {n}", c.label));
        }
        (None, false) => {
            out.say(format!(
                "{}: released {what}: a pod of it leads at its next try (not waited for)",
                c.label
            ));
        }
        (_, true) => {
            out.say(format!(
                "{}: {what} leads again ({}) after {:.1}s",
                c.label,
                pods.join(", "),
                start.elapsed().as_secs_f64()
            ));
        }
    }
    Ok(Some(Restored {
        cluster: c.label,
        deployment: what,
        strategy: Strategy::Lease,
        replicas: r.replicas.unwrap_or(0),
        leader: leaders.first().map(|(_, p)| p.clone()),
        note,
    }))
}

/// The pod of `deployment` that leads Lease `l`, once one does; `None` past the lead timeout
/// (counted from when every Lease was free).
async fn leader_by(
    c: &Cluster,
    opts: &CloseOptions,
    ns: &str,
    l: &str,
    deployment: &str,
    start: tokio::time::Instant,
) -> Result<Option<String>> {
    loop {
        if let Some(pod) = lease::leader(c, ns, l, deployment).await? {
            return Ok(Some(pod));
        }
        if start.elapsed() >= opts.lead_timeout {
            return Ok(None);
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// Scale a Deployment back to its recorded count where `open` added a standby, once it has
/// that many Ready pods (the ReplicaSet controller then removes an unready pod first, so the
/// one that stays is Ready); the count to wait for, or `None` where nothing was scaled.
async fn scale_back_standby(
    c: &Cluster,
    p: &PinnedDeployment,
    opts: &CloseOptions,
    out: &mut Progress,
) -> Result<Option<i32>> {
    if !p.standby {
        return Ok(None);
    }
    let (ns, name) = (p.namespace.as_str(), p.name.as_str());
    let Some(d) = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?
    else {
        return Ok(None);
    };
    let now = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    match stop::standby_back(p, now) {
        Some(count) => {
            // Unreported: said once the scale-down settles (or does not).
            let _ = standby::wait_ready(c, ns, name, count, opts.lead_timeout, opts.poll).await?;
            standby::scale(c, ns, name, count).await?;
            Ok(Some(count))
        }
        // Scaled back already (a run that died before it recorded so).
        None if now == p.saved_replicas => Ok(Some(now)),
        None => {
            out.say(format!(
                "{}: {ns}/{name} runs {now} replicas, not the {} handoff left it at: left as it is",
                c.label,
                p.saved_replicas + 1
            ));
            Ok(Some(now))
        }
    }
}
