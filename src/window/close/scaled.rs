//! A window's Scale-stopped Deployments back at the counts they had: every unrestored record,
//! and every selected Deployment the webhook pinned after `open` ran; then watched for a
//! settle time, since a replica whose cache lags may pin one again.

use crate::window::progress::Progress;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use super::{CloseOptions, Restored};
use crate::resources::move_window::{MoveWindow, MoveWindowStatus, PinnedDeployment, Strategy};
use crate::rules::move_window::SAVED_REPLICAS_ANNOTATION;
use crate::rules::selector::Selector;
use crate::window::cluster::{
    Cluster, Result, WindowError, api_err, dep_key, now, pinned_mut, record, upsert_pinned,
};
use crate::window::plan::stop;

type Key = (String, String);

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
                cluster: c.label.into(),
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

/// Restore every Scale-stopped Deployment of the window `w`, closed already.
pub async fn restore_all(
    c: &Cluster,
    opts: &CloseOptions,
    w: &MoveWindow,
    status: &MoveWindowStatus,
    out: &mut Progress,
) -> Result<Vec<Restored>> {
    let selector = w.spec.selector().map_err(|e| WindowError::Refused {
        cluster: c.label.into(),
        message: format!("MoveWindow {}: {e}", opts.name),
    })?;
    let others = open_others(c, opts).await?;
    let recorded: BTreeMap<Key, PinnedDeployment> = status
        .pinned
        .iter()
        .map(|p| ((p.namespace.clone(), p.name.clone()), p.clone()))
        .collect();
    let mut restored = Vec::new();
    for (ns, name) in to_restore(c, &selector, &recorded).await? {
        let entry = recorded.get(&(ns.clone(), name.clone()));
        if let Some(r) = restore_scaled(c, opts, &ns, &name, entry, &others, out).await? {
            restored.push(r);
        }
    }
    settle(c, opts, &restored, out).await?;
    Ok(restored)
}

/// The other open windows, and what they select: what they pin stays pinned.
async fn open_others(c: &Cluster, opts: &CloseOptions) -> Result<Vec<(String, Selector)>> {
    Ok(Api::<MoveWindow>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing MoveWindows"))?
        .into_iter()
        .filter(|o| o.metadata.name.as_deref() != Some(&opts.name) && o.spec.is_open())
        .filter_map(|o| Some((o.metadata.name.clone()?, o.spec.selector().ok()?)))
        .collect())
}

/// Every unrestored Scale record, and every selected Deployment still carrying the saved
/// count (pinned by the webhook after `open` ran).
async fn to_restore(
    c: &Cluster,
    selector: &Selector,
    recorded: &BTreeMap<Key, PinnedDeployment>,
) -> Result<BTreeSet<Key>> {
    let mut todo: BTreeSet<Key> = recorded
        .iter()
        .filter(|(_, p)| p.restored_at.is_none() && p.strategy() == Strategy::Scale)
        .map(|(k, _)| k.clone())
        .collect();
    for d in Api::<Deployment>::all(c.client.clone())
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
    Ok(todo)
}

/// Restore one Deployment to the count the plan gives, recorded before and after; `None`
/// where it is gone or another open window still selects it.
async fn restore_scaled(
    c: &Cluster,
    opts: &CloseOptions,
    ns: &str,
    name: &str,
    entry: Option<&PinnedDeployment>,
    others: &[(String, Selector)],
    out: &mut Progress,
) -> Result<Option<Restored>> {
    let Some(d) = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?
    else {
        out.say(format!("{}: {ns}/{name} no longer exists", c.label));
        record(c, &opts.name, |s| {
            if let Some(p) = pinned_mut(s, ns, name) {
                p.restored_at = Some(now());
                p.note = Some("Deployment no longer exists".into());
            }
        })
        .await?;
        return Ok(None);
    };
    if let Some((other, _)) = others
        .iter()
        .find(|(_, sel)| sel.matches(d.metadata.labels.as_ref()))
    {
        out.say(format!(
            "{}: {ns}/{name} stays pinned: MoveWindow {other} is still open and selects it",
            c.label
        ));
        return Ok(None);
    }
    let annotation = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION))
        .cloned();
    let (count, note) = stop::restore_count(annotation.as_deref(), entry);
    record_restoring(c, opts, ns, name, count, &note).await?;
    restore_deployment(c, ns, name, count, opts).await?;
    record(c, &opts.name, |s| {
        if let Some(p) = pinned_mut(s, ns, name)
            && p.strategy() == Strategy::Scale
        {
            p.restored_at = Some(now());
        }
        s.last_step = Some(format!("restored {ns}/{name}"));
    })
    .await?;
    match &note {
        Some(n) => {
            out.say(format!(
                "{}: restored {ns}/{name} to {count} — {n}",
                c.label
            ));
        }
        None => {
            out.say(format!("{}: restored {ns}/{name} to {count}", c.label));
        }
    }
    Ok(Some(Restored {
        cluster: c.label,
        deployment: format!("{ns}/{name}"),
        strategy: Strategy::Scale,
        replicas: count,
        leader: None,
        note,
    }))
}

/// Record what is about to be done, so a re-run after the annotation is gone knows. A
/// Lease-stopped one caught by the pin keeps its strategy and Leases.
async fn record_restoring(
    c: &Cluster,
    opts: &CloseOptions,
    ns: &str,
    name: &str,
    count: i32,
    note: &Option<String>,
) -> Result<()> {
    record(c, &opts.name, |s| {
        let base = pinned_mut(s, ns, name).cloned().unwrap_or_default();
        upsert_pinned(
            s,
            PinnedDeployment {
                namespace: ns.to_string(),
                name: name.to_string(),
                saved_replicas: count,
                restored_at: None,
                note: note.clone(),
                ..base
            },
        );
        s.last_step = Some(format!("restoring {ns}/{name}"));
    })
    .await
    .map(|_| ())
}

/// A replica whose watch lags may pin again right after a restore: look once more after the
/// settle time, and restore again whatever it caught. Done when a whole settle period passes
/// with nothing pinned again.
async fn settle(
    c: &Cluster,
    opts: &CloseOptions,
    restored: &[Restored],
    out: &mut Progress,
) -> Result<()> {
    let settling = tokio::time::Instant::now();
    while !restored.is_empty() && !opts.settle.is_zero() {
        tokio::time::sleep(opts.settle).await;
        let mut again = false;
        for r in restored {
            let (ns, name) = r.deployment.split_once('/').unwrap_or_default();
            if !is_restored(c, ns, name, r.replicas).await? {
                out.say(format!(
                    "{}: {ns}/{name} was pinned again; restoring again",
                    c.label
                ));
                restore_deployment(c, ns, name, r.replicas, opts).await?;
                again = true;
            }
        }
        if !again {
            break;
        }
        if settling.elapsed() >= opts.restore_timeout {
            return Err(WindowError::Timeout {
                cluster: c.label.into(),
                after: opts.restore_timeout,
                what: "waiting for restored Deployments to stay restored (is a handoff replica still seeing the window open?)".into(),
            });
        }
    }
    Ok(())
}
