//! `handoff window close`: set the window Closed, restore every Scale-stopped Deployment,
//! release every held Lease and wait until each controller runs or leads again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

use super::common::{
    Cluster, Result, WindowError, api_err, dep_key, labels, now, pinned_mut, read_window, record,
    set_state, upsert_pinned,
};
use super::lease;
use super::plan;
use super::standby;
use crate::resources::move_window::{
    HeldLease, MoveWindow, MoveWindowStatus, PinnedDeployment, Strategy, WindowState,
};
use crate::resources::phase::WindowPhase;
use crate::rules::move_window::SAVED_REPLICAS_ANNOTATION;
use crate::rules::selector::Selector;

#[derive(Debug, Clone)]
pub struct CloseOptions {
    pub name: String,
    /// How long a restore may keep being re-pinned by a webhook that has not yet seen the
    /// window close.
    pub restore_timeout: Duration,
    pub poll: Duration,
    /// After restoring, wait this long and check again: a handoff replica whose cache lags
    /// may pin a Deployment once more just after it was restored.
    pub settle: Duration,
    /// How long a released Lease may stay without a pod of its Deployment leading.
    pub lead_timeout: Duration,
}

/// Restore one Deployment to `count` and drop the annotation; retried while a webhook that has
/// not yet seen the window close pins it again.
async fn restore_deployment(
    c: &Cluster,
    ns: &str,
    name: &str,
    count: i32,
    opts: &CloseOptions,
) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    let start = tokio::time::Instant::now();
    loop {
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {SAVED_REPLICAS_ANNOTATION: null}},
                "spec": {"replicas": count}
            })),
        )
        .await
        .map_err(api_err(c, format!("restoring Deployment {ns}/{name}")))?;
        if is_restored(c, ns, name, count).await? {
            return Ok(());
        }
        if start.elapsed() >= opts.restore_timeout {
            return Err(WindowError::Timeout {
                cluster: c.label.clone(),
                after: opts.restore_timeout,
                what: format!(
                    "restoring {ns}/{name}: something (a handoff replica that has not seen the window close?) keeps pinning it"
                ),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// Whether the Deployment runs `count` replicas and carries no saved count.
async fn is_restored(c: &Cluster, ns: &str, name: &str, count: i32) -> Result<bool> {
    let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get(name)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
    let annotated = d
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(SAVED_REPLICAS_ANNOTATION));
    Ok(d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) == count && !annotated)
}

/// What `close` did to one Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    pub cluster: String,
    pub deployment: String,
    pub strategy: Strategy,
    /// Scale: the count restored. Lease: the count it runs.
    pub replicas: i32,
    /// Lease: the pod that leads again.
    pub leader: Option<String>,
    pub note: Option<String>,
}

/// `None` when the cluster has no such window.
async fn close_one(
    c: &Cluster,
    opts: &CloseOptions,
    out: &mut dyn Write,
) -> Result<Option<Vec<Restored>>> {
    let Some(w) = read_window(c, &opts.name).await? else {
        // Deleted without being closed: the Leases it held still say so, and nothing else
        // will ever release them.
        let orphans = lease::held_anywhere(c, &opts.name, out).await?;
        if orphans.is_empty() {
            let _ = writeln!(
                out,
                "{}: there is no MoveWindow {}: nothing to close here",
                c.label, opts.name
            );
            return Ok(None);
        }
        let mut restored = Vec::new();
        for (ns, l) in orphans {
            let released = lease::release(c, &ns, &l, &opts.name).await?;
            if released != lease::Released::AlreadyFree {
                let _ = match &released {
                    lease::Released::TakenBack(holder) => writeln!(
                        out,
                        "{}: there is no MoveWindow {} any more; Lease {ns}/{l} still carried its label, held by {} since: removed the label, left the holder",
                        c.label,
                        opts.name,
                        who(holder)
                    ),
                    _ => writeln!(
                        out,
                        "{}: there is no MoveWindow {} any more; released Lease {ns}/{l}, which it still held",
                        c.label, opts.name
                    ),
                };
                restored.push(Restored {
                    cluster: c.label.clone(),
                    deployment: format!("{ns}/(Lease {l})"),
                    strategy: Strategy::Lease,
                    replicas: 0,
                    leader: None,
                    note: Some("released from a deleted MoveWindow".into()),
                });
            }
        }
        return Ok(Some(restored));
    };
    // Closed first: from here on the webhook lets restores through.
    if w.spec.state != WindowState::Closed {
        set_state(c, &opts.name, WindowState::Closed).await?;
    }
    // Then unbound: the restores below must not be pinned again inside the API server.
    if crate::admission_policy::apply::unbind_window(&c.client, &opts.name)
        .await
        .map_err(api_err(
            c,
            format!(
                "removing MoveWindow {}'s admission policy bindings",
                opts.name
            ),
        ))?
    {
        let _ = writeln!(
            out,
            "{}: removed the pin's MutatingAdmissionPolicyBindings of MoveWindow {}",
            c.label, opts.name
        );
    }
    let status = record(c, &opts.name, |s| {
        if s.phase != Some(WindowPhase::Closed) {
            s.phase = Some(WindowPhase::Closing);
        }
        s.last_step = Some("window-closed".into());
    })
    .await?;
    let _ = writeln!(
        out,
        "{}: MoveWindow {} is closed; restoring",
        c.label, opts.name
    );

    let selector = w.spec.selector().map_err(|e| WindowError::Refused {
        cluster: c.label.clone(),
        message: format!("MoveWindow {}: {e}", opts.name),
    })?;
    let others: Vec<(String, Selector)> = Api::<MoveWindow>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing MoveWindows"))?
        .into_iter()
        .filter(|o| o.metadata.name.as_deref() != Some(&opts.name) && o.spec.is_open())
        .filter_map(|o| Some((o.metadata.name.clone()?, o.spec.selector().ok()?)))
        .collect();

    // What to restore: every unrestored record, and every selected Deployment still carrying
    // the annotation (pinned by the webhook after `open` ran).
    let recorded: BTreeMap<(String, String), PinnedDeployment> = status
        .pinned
        .iter()
        .map(|p| ((p.namespace.clone(), p.name.clone()), p.clone()))
        .collect();
    let mut todo: BTreeSet<(String, String)> = recorded
        .iter()
        .filter(|(_, p)| p.restored_at.is_none() && p.strategy() == Strategy::Scale)
        .map(|(k, _)| k.clone())
        .collect();
    let deployments: Api<Deployment> = Api::all(c.client.clone());
    for d in deployments
        .list(&ListParams::default().labels(&selector.to_string()))
        .await
        .map_err(api_err(c, "listing Deployments"))?
    {
        let has = d
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SAVED_REPLICAS_ANNOTATION));
        if has && selector.matches(d.metadata.labels.as_ref()) {
            todo.insert(dep_key(&d));
        }
    }

    let mut restored = Vec::new();
    for (ns, name) in todo {
        let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns);
        let Some(d) = api
            .get_opt(&name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?
        else {
            let _ = writeln!(out, "{}: {ns}/{name} no longer exists", c.label);
            record(c, &opts.name, |s| {
                if let Some(p) = s
                    .pinned
                    .iter_mut()
                    .find(|p| p.namespace == ns && p.name == name)
                {
                    p.restored_at = Some(now());
                    p.note = Some("Deployment no longer exists".into());
                }
            })
            .await?;
            continue;
        };
        if let Some((other, _)) = others
            .iter()
            .find(|(_, sel)| sel.matches(d.metadata.labels.as_ref()))
        {
            let _ = writeln!(
                out,
                "{}: {ns}/{name} stays pinned: MoveWindow {other} is still open and selects it",
                c.label
            );
            continue;
        }
        let annotation = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION))
            .cloned();
        let record_entry = recorded.get(&(ns.clone(), name.clone()));
        let (count, note) = plan::restore_count(annotation.as_deref(), record_entry);
        // Record what we are about to do, so a re-run after the annotation is gone knows.
        // A Lease-stopped one caught by the pin keeps its strategy and Leases.
        record(c, &opts.name, |s| {
            let base = s
                .pinned
                .iter()
                .find(|p| p.namespace == ns && p.name == name)
                .cloned()
                .unwrap_or_default();
            upsert_pinned(
                s,
                PinnedDeployment {
                    namespace: ns.clone(),
                    name: name.clone(),
                    saved_replicas: count,
                    restored_at: None,
                    note: note.clone(),
                    ..base
                },
            );
            s.last_step = Some(format!("restoring {ns}/{name}"));
        })
        .await?;
        restore_deployment(c, &ns, &name, count, opts).await?;
        record(c, &opts.name, |s| {
            if let Some(p) = s
                .pinned
                .iter_mut()
                .find(|p| p.namespace == ns && p.name == name)
                && p.strategy() == Strategy::Scale
            {
                p.restored_at = Some(now());
            }
            s.last_step = Some(format!("restored {ns}/{name}"));
        })
        .await?;
        match &note {
            Some(n) => {
                let _ = writeln!(out, "{}: restored {ns}/{name} to {count} — {n}", c.label);
            }
            None => {
                let _ = writeln!(out, "{}: restored {ns}/{name} to {count}", c.label);
            }
        }
        restored.push(Restored {
            cluster: c.label.clone(),
            deployment: format!("{ns}/{name}"),
            strategy: Strategy::Scale,
            replicas: count,
            leader: None,
            note,
        });
    }
    // A replica whose watch lags may pin again right after a restore: look once more after
    // the settle time, and restore again whatever it caught.
    // Done when a whole settle period passes with nothing pinned again.
    let settling = tokio::time::Instant::now();
    while !restored.is_empty() && !opts.settle.is_zero() {
        tokio::time::sleep(opts.settle).await;
        let mut again = false;
        for r in &restored {
            let (ns, name) = r.deployment.split_once('/').unwrap_or_default();
            if !is_restored(c, ns, name, r.replicas).await? {
                let _ = writeln!(
                    out,
                    "{}: {ns}/{name} was pinned again; restoring again",
                    c.label
                );
                restore_deployment(c, ns, name, r.replicas, opts).await?;
                again = true;
            }
        }
        if !again {
            break;
        }
        if settling.elapsed() >= opts.restore_timeout {
            return Err(WindowError::Timeout {
                cluster: c.label.clone(),
                after: opts.restore_timeout,
                what: "waiting for restored Deployments to stay restored (is a handoff replica still seeing the window open?)".into(),
            });
        }
    }
    // Then the Leases, once every Scale-stopped controller runs again.
    restored.extend(release_leases(c, opts, &status, out).await?);
    record(c, &opts.name, |s| {
        s.phase = Some(WindowPhase::Closed);
        s.closed_at.get_or_insert_with(now);
        s.last_step = Some("restored".into());
    })
    .await?;
    Ok(Some(restored))
}

/// Release every Lease the window holds on this cluster, then wait until a pod of each
/// Deployment leads again.
async fn release_leases(
    c: &Cluster,
    opts: &CloseOptions,
    status: &MoveWindowStatus,
    out: &mut dyn Write,
) -> Result<Vec<Restored>> {
    let entries: Vec<&PinnedDeployment> = status
        .pinned
        .iter()
        .filter(|p| p.strategy() == Strategy::Lease && p.restored_at.is_none())
        .collect();
    // The standbys `open` added go before any Lease is free, all at once: the pod that stays
    // then leads, instead of one that the scale-down might stop while it leads.
    let mut back = Vec::new();
    for p in &entries {
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
        let _ = writeln!(
            out,
            "{}: the standbys go, back to: {}",
            c.label,
            scaled.join(", ")
        );
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
            let _ = writeln!(
                out,
                "warning: {why}; releasing its Lease without knowing that the pod that stays is Ready"
            );
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
    // (entry, the Leases released or found free, replicas now)
    let mut waiting = Vec::new();
    for p in &entries {
        let (ns, name) = (p.namespace.as_str(), p.name.as_str());
        // The recorded Leases, and any other the window holds for this Deployment (a run
        // that died between a take and its record).
        let mut names: BTreeSet<String> = p.leases.iter().map(|l| l.name.clone()).collect();
        for claim in plan::claims(name, &lease::leases_in(c, ns).await?, &opts.name) {
            if let plan::Claim::HeldHere(l) = claim {
                names.insert(l.name);
            }
        }
        let mut taken_back = Vec::new();
        for l in &names {
            let released = lease::release(c, ns, l, &opts.name).await?;
            record(c, &opts.name, |s| {
                if let Some(e) = s
                    .pinned
                    .iter_mut()
                    .find(|e| e.namespace == ns && e.name == name)
                {
                    match e.leases.iter_mut().find(|h| &h.name == l) {
                        Some(h) => {
                            h.released_at.get_or_insert_with(now);
                        }
                        None => e.leases.push(HeldLease {
                            name: l.clone(),
                            released_at: Some(now()),
                            ..HeldLease::default()
                        }),
                    }
                }
                s.last_step = Some(format!("released Lease {ns}/{l}"));
            })
            .await?;
            let _ = match &released {
                // Said with the pod that leads again, below.
                lease::Released::Freed => Ok(()),
                lease::Released::AlreadyFree => {
                    writeln!(out, "{}: Lease {ns}/{l} already released", c.label)
                }
                lease::Released::TakenBack(holder) => {
                    taken_back.push(format!(
                        "Lease {l} was taken back by {} while the window held it",
                        who(holder)
                    ));
                    writeln!(
                        out,
                        "warning: {}: Lease {ns}/{l} was taken back by {} while MoveWindow {} held it: not written free over it (its controllers may have run during the window; handoff's label is removed)",
                        c.label,
                        who(holder),
                        opts.name
                    )
                }
            };
        }
        let replicas = Api::<Deployment>::namespaced(c.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?
            .map(|d| d.spec.and_then(|s| s.replicas).unwrap_or(1));
        waiting.push((*p, names, replicas, taken_back));
    }
    // Every Lease free, then the wait: the candidates of all of them try at once.
    let start = tokio::time::Instant::now();
    let mut restored = Vec::new();
    let mut left: Vec<String> = Vec::new();
    for (p, names, replicas, taken_back) in waiting {
        let (ns, name) = (p.namespace.as_str(), p.name.as_str());
        let what = format!("{ns}/{name}");
        let gone = match replicas {
            None => Some("Deployment no longer exists".to_string()),
            Some(0) => Some("runs 0 replicas: no pod can lead".to_string()),
            Some(_) => None,
        };
        let waits = gone.is_none();
        let note = match (gone, taken_back.is_empty()) {
            (Some(n), _) => Some(n),
            (None, false) => Some(taken_back.join("; ")),
            (None, true) => None,
        };
        let mut leaders = Vec::new();
        if waits {
            for l in &names {
                loop {
                    if let Some(pod) = lease::leader(c, ns, l, name).await? {
                        leaders.push((l.clone(), pod));
                        break;
                    }
                    if start.elapsed() >= opts.lead_timeout {
                        left.push(format!("{what} (Lease {l})"));
                        break;
                    }
                    tokio::time::sleep(opts.poll).await;
                }
            }
        }
        if leaders.len() < names.len() && waits {
            continue;
        }
        record(c, &opts.name, |s| {
            if let Some(e) = s
                .pinned
                .iter_mut()
                .find(|e| e.namespace == ns && e.name == name)
            {
                for h in e.leases.iter_mut() {
                    if let Some((_, pod)) = leaders.iter().find(|(l, _)| *l == h.name) {
                        h.leads_again = Some(pod.clone());
                    }
                }
                e.restored_at = Some(now());
                e.note = note.clone();
            }
            s.last_step = Some(format!("{what} leads again"));
        })
        .await?;
        let _ = match (&note, waits) {
            (Some(n), false) => writeln!(out, "{}: released {what}: {n}", c.label),
            _ => writeln!(
                out,
                "{}: {what} leads again ({}) after {:.1}s",
                c.label,
                leaders
                    .iter()
                    .map(|(_, p)| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                start.elapsed().as_secs_f64()
            ),
        };
        restored.push(Restored {
            cluster: c.label.clone(),
            deployment: what,
            strategy: Strategy::Lease,
            replicas: replicas.unwrap_or(0),
            leader: leaders.first().map(|(_, p)| p.clone()),
            note,
        });
    }
    if !left.is_empty() {
        return Err(WindowError::Timeout {
            cluster: c.label.clone(),
            after: opts.lead_timeout,
            what: format!(
                "waiting for a pod to lead again: {} (the Leases are free; are its pods running? `kubectl get pods` and their logs tell)",
                left.join(", ")
            ),
        });
    }
    Ok(restored)
}

fn who(holder: &str) -> &str {
    match holder {
        "" => "nobody (written free by someone else)",
        h => h,
    }
}

/// Scale a Deployment back to its recorded count where `open` added a standby, once it has
/// that many Ready pods (the ReplicaSet controller then removes an unready pod first, so the
/// one that stays is Ready); the count to wait for, or `None` where nothing was scaled.
async fn scale_back_standby(
    c: &Cluster,
    p: &PinnedDeployment,
    opts: &CloseOptions,
    out: &mut dyn Write,
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
    match plan::standby_back(p, now) {
        Some(count) => {
            // Unreported: said once the scale-down settles (or does not).
            let _ = standby::wait_ready(c, ns, name, count, opts.lead_timeout, opts.poll).await?;
            standby::scale(c, ns, name, count).await?;
            Ok(Some(count))
        }
        // Scaled back already (a run that died before it recorded so).
        None if now == p.saved_replicas => Ok(Some(now)),
        None => {
            let _ = writeln!(
                out,
                "{}: {ns}/{name} runs {now} replicas, not the {} handoff left it at: left as it is",
                c.label,
                p.saved_replicas + 1
            );
            Ok(Some(now))
        }
    }
}

/// Close a window on every cluster in the order given (the caller puts the target first).
pub async fn close(
    clusters: &[Cluster],
    opts: &CloseOptions,
    out: &mut dyn Write,
) -> Result<Vec<Restored>> {
    // A cluster without the window (an `open` that died before creating it there) does not
    // stop the others from closing; a name that exists nowhere is an error.
    let mut all = Vec::new();
    let mut found = false;
    for c in clusters {
        if let Some(restored) = close_one(c, opts, out).await? {
            found = true;
            all.extend(restored);
        }
    }
    if !found {
        return Err(WindowError::Refused {
            cluster: labels(clusters),
            message: format!("there is no MoveWindow {}: nothing to close", opts.name),
        });
    }
    Ok(all)
}
