//! `handoff window open`: choose how each selected Deployment is stopped, stop it, and prove
//! it stopped. This file is the order of it, on every cluster at once; `choose` reads and
//! decides, `by_lease` and `by_scale` stop.

mod by_lease;
mod by_scale;
mod choose;

use std::io::Write;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::PostParams;

use super::common::{
    Cluster, Result, WindowError, api_err, labels, now, read_window, record, set_state,
    upsert_pinned,
};
use super::lease;
use super::plan;
use super::preflight::preflight;
use crate::resources::move_window::{
    MoveWindow, MoveWindowSpec, MoveWindowStatus, PinnedDeployment, StopPolicy, Strategy,
    WindowState,
};
use crate::rules::move_window::OwnDeployment;
use crate::rules::selector::Selector;
use by_lease::{leased_record, proven_at, take_leases};
use by_scale::{pin_deployment, wait_pods_gone, wait_policy_in_force};
pub use choose::plan_open;
use choose::{Choice, Stop, choose, leased};

#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub name: String,
    pub selector: Option<LabelSelector>,
    pub reason: Option<String>,
    pub allow_webhook_outage: bool,
    /// How long to wait for the pinned pods to be gone; zero skips the wait.
    pub wait_timeout: Duration,
    pub poll: Duration,
    pub own: OwnDeployment,
    /// `--stop`: `None` keeps an existing window's, or `Auto` for a new one.
    pub stop: Option<StopPolicy>,
}

/// Create the window, or re-open an existing one, recording the Lease-stopped Deployments in
/// the same status write (so that neither the pin nor its policy scales them); returns whether
/// the pin's admission policies are bound to it.
async fn ensure_open(
    c: &Cluster,
    opts: &OpenOptions,
    leased: &[PinnedDeployment],
    out: &mut dyn Write,
) -> Result<bool> {
    // `checked` refused an existing window whose selector or stop policy the flags contradict.
    // A window is created (or re-opened) Closed, its Lease-stopped Deployments recorded, and
    // only then set Open: a pin that sees it open always sees which ones not to scale.
    let (spec, was_open) = match read_window(c, &opts.name).await? {
        None => {
            let spec = MoveWindowSpec {
                state: WindowState::Closed,
                deployment_selector: opts.selector.clone(),
                reason: opts.reason.clone(),
                role: c.role,
                stop: opts.stop,
            };
            Api::<MoveWindow>::all(c.client.clone())
                .create(
                    &PostParams::default(),
                    &MoveWindow::new(&opts.name, spec.clone()),
                )
                .await
                .map_err(api_err(c, format!("creating MoveWindow {}", opts.name)))?;
            (spec, false)
        }
        Some(w) => {
            let open = w.spec.is_open();
            if open {
                let _ = writeln!(out, "{}: MoveWindow {} is already open", c.label, opts.name);
            }
            (w.spec, open)
        }
    };
    // Recorded before the pin's policies are bound: their condition reads the strategies.
    record(c, &opts.name, |s| {
        if s.phase.as_deref() != Some("Open") {
            // A new opening: what an earlier window recorded about its pods no longer holds.
            if s.phase.as_deref() != Some("Opening") {
                s.pods_gone_at = None;
                s.opened_at = None;
            }
            s.phase = Some("Opening".into());
        }
        s.opened_at.get_or_insert_with(now);
        s.closed_at = None;
        s.last_step = Some("window-open".into());
        for p in leased {
            merge_leased(s, p.clone());
        }
    })
    .await?;
    if !was_open {
        set_state(c, &opts.name, WindowState::Open).await?;
        let _ = writeln!(out, "{}: MoveWindow {} is Open", c.label, opts.name);
    }
    // With the pin's admission policies installed, the window binds them too, so that it
    // pins inside the API server even while no handoff replica runs.
    let bound = crate::admission_policy::apply::pin_installed(&c.client)
        .await
        .map_err(api_err(c, "reading the MutatingAdmissionPolicy"))?;
    if bound {
        let labels = spec
            .deployment_selector
            .clone()
            .unwrap_or_else(crate::resources::move_window::default_deployment_selector);
        crate::admission_policy::apply::bind_window(&c.client, &opts.name, &labels)
            .await
            .map_err(api_err(
                c,
                format!(
                    "binding the pin's admission policies to MoveWindow {}",
                    opts.name
                ),
            ))?;
        let _ = writeln!(
            out,
            "{}: bound the pin's MutatingAdmissionPolicies to MoveWindow {}",
            c.label, opts.name
        );
    }
    Ok(bound)
}

/// Record a Lease-stopped Deployment, keeping what an earlier run recorded of its Leases (the
/// former holders, when they were taken).
fn merge_leased(s: &mut MoveWindowStatus, mut p: PinnedDeployment) {
    if let Some(old) = s
        .pinned
        .iter()
        .find(|o| o.namespace == p.namespace && o.name == p.name && o.restored_at.is_none())
    {
        for l in &mut p.leases {
            if let Some(o) = old
                .leases
                .iter()
                .find(|o| o.name == l.name && o.released_at.is_none())
            {
                *l = o.clone();
            }
        }
        p.stopped_since = old.stopped_since.clone();
    }
    upsert_pinned(s, p);
}

/// What `open` checks before it writes anything, on every cluster: how each Deployment would
/// be stopped, and the preflight (a Scale-stopped Deployment behind a fail-closed webhook is
/// refused unless `--allow-webhook-outage`). `handoff move` runs it for both clusters before
/// it starts.
pub async fn check(clusters: &[Cluster], opts: &OpenOptions, out: &mut dyn Write) -> Result<()> {
    checked(clusters, opts, out).await.map(|_| ())
}

type Chosen = (Selector, StopPolicy, Vec<Choice>);

async fn checked(
    clusters: &[Cluster],
    opts: &OpenOptions,
    out: &mut dyn Write,
) -> Result<Vec<Chosen>> {
    // The name becomes a label value on held Leases (at most 63 characters), refused now
    // rather than after the first Deployment is stopped.
    if opts.name.len() > 63 {
        return Err(WindowError::Refused {
            cluster: labels(clusters),
            message: format!(
                "MoveWindow name {:?} is {} characters; at most 63 (it labels the Leases a window holds)",
                opts.name,
                opts.name.len()
            ),
        });
    }
    let mut chosen = Vec::new();
    for c in clusters {
        chosen.push(choose(c, opts).await?);
    }
    let mut findings = Vec::new();
    for (c, (selector, _, choices)) in clusters.iter().zip(&chosen) {
        for f in preflight(c, selector, &opts.own).await? {
            if leased(choices, &f) {
                let _ = writeln!(out, "{f}: stopped by Lease, its webhooks keep serving");
            } else {
                findings.push(f);
            }
        }
    }
    if !findings.is_empty() {
        if !opts.allow_webhook_outage {
            return Err(WindowError::Preflight(findings));
        }
        for f in &findings {
            let _ = writeln!(out, "warning: {f} (allowed by --allow-webhook-outage)");
        }
    }
    Ok(chosen)
}

/// Open a window on every cluster: choose and preflight all, then create the windows, stop
/// every selected Deployment (Lease or Scale, source first), and wait until each is proven
/// stopped: the former leaders' `leaseDurationSeconds` after the take-over for a Lease, the
/// pods gone for a Scale.
pub async fn open(clusters: &[Cluster], opts: &OpenOptions, out: &mut dyn Write) -> Result<()> {
    let started = tokio::time::Instant::now();
    let chosen = checked(clusters, opts, out).await?;
    // Who holds the Leases: asked once, and only where a Lease will be taken.
    let mut operators: Vec<Option<String>> = Vec::new();
    for (c, (_, _, choices)) in clusters.iter().zip(&chosen) {
        let needs = choices.iter().any(|ch| matches!(ch.plan, Stop::Lease(_)));
        let me = match needs {
            true => Some(lease::whoami(c).await?),
            false => None,
        };
        if let Some(me) = &me {
            for ch in choices {
                let Stop::Lease(leases) = &ch.plan else {
                    continue;
                };
                if let Some(message) = leases
                    .iter()
                    .find_map(|l| plan::held_for_another(l, &opts.name, me))
                {
                    return Err(WindowError::Refused {
                        cluster: c.label.clone(),
                        message: format!("{}: {message}", ch.what()),
                    });
                }
            }
        }
        operators.push(me);
    }
    // Every window exists and is open before any Deployment is stopped anywhere, so a cluster
    // that fails here leaves no controller stopped without a window to close.
    let mut bound = Vec::new();
    for ((c, (_, _, choices)), operator) in clusters.iter().zip(&chosen).zip(&operators) {
        let leased: Vec<PinnedDeployment> = choices.iter().filter_map(leased_record).collect();
        bound.push(ensure_open(c, opts, &leased, out).await?);
        if let Some(op) = operator {
            record(c, &opts.name, |s| {
                s.operator = Some(op.clone());
            })
            .await?;
        }
    }
    let mut scaled = Vec::new();
    let mut proofs = Vec::new();
    for (((c, (_, _, choices)), operator), bound) in
        clusters.iter().zip(&chosen).zip(&operators).zip(&bound)
    {
        let mut keys = Vec::new();
        if choices.is_empty() {
            let _ = writeln!(out, "{}: no Deployment is selected", c.label);
        }
        for ch in choices {
            let (ns, name) = (ch.namespace.clone(), ch.name.clone());
            match &ch.plan {
                Stop::Scale(_) => {
                    let saved = pin_deployment(c, &ns, &name, out).await?;
                    record(c, &opts.name, |s| {
                        upsert_pinned(
                            s,
                            PinnedDeployment {
                                namespace: ns.clone(),
                                name: name.clone(),
                                strategy: Some(Strategy::Scale),
                                saved_replicas: saved,
                                ..PinnedDeployment::default()
                            },
                        );
                        s.last_step = Some(format!("pinned {ns}/{name}"));
                    })
                    .await?;
                    keys.push((ns, name));
                }
                Stop::Lease(_) => {
                    let op = operator.as_deref().expect("asked where a Lease is taken");
                    let held = take_leases(c, opts, ch, op, out).await?;
                    proofs.push((c.clone(), ch.clone(), proven_at(&held)));
                }
            }
        }
        if let (true, Some(first)) = (bound, keys.first()) {
            wait_policy_in_force(c, first, out).await?;
        }
        scaled.push((c.clone(), keys));
    }
    // The Lease bound: the former leaders may go on reconciling until then.
    if let Some(until) = proofs.iter().map(|(_, _, t)| *t).max() {
        let names: Vec<String> = proofs
            .iter()
            .map(|(c, ch, _)| format!("{}: {}", c.label, ch.what()))
            .collect();
        lease::sleep_until(
            until,
            &format!(
                "the former leaders can no longer be leading ({})",
                names.join(", ")
            ),
            out,
        )
        .await;
        for (c, ch, at) in &proofs {
            record(c, &opts.name, |s| {
                if let Some(p) = s
                    .pinned
                    .iter_mut()
                    .find(|p| p.namespace == ch.namespace && p.name == ch.name)
                {
                    p.stopped_since.get_or_insert_with(|| at.to_string());
                }
                s.last_step = Some(format!("stopped {}", ch.what()));
            })
            .await?;
            let _ = writeln!(
                out,
                "{}: {} is stopped: no replica can be leading since {at}; its pods keep serving webhooks",
                c.label,
                ch.what()
            );
        }
    }
    if !opts.wait_timeout.is_zero() {
        wait_pods_gone(&scaled, opts, out).await?;
    }
    for (c, _) in &scaled {
        record(c, &opts.name, |s| {
            s.phase = Some("Open".into());
            if !opts.wait_timeout.is_zero() {
                s.pods_gone_at.get_or_insert_with(now);
            }
            s.last_step = Some("stopped".into());
        })
        .await?;
        let _ = writeln!(out, "{}: MoveWindow {} is open", c.label, opts.name);
    }
    let _ = writeln!(
        out,
        "every selected controller proven stopped in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
