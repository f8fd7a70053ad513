//! `handoff window open`: choose how each selected Deployment is stopped, stop it, and prove
//! it stopped.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{
    Cluster, Result, WindowError, api_err, dep_key, labels, now, read_window, record,
    selected_deployments, set_state, upsert_pinned,
};
use super::lease;
use super::plan::{self, LeaseSeen, PinPlan, StopChoice};
use super::preflight::{Finding, preflight};
use crate::resources::move_window::{
    HeldLease, MoveWindow, MoveWindowSpec, MoveWindowStatus, PinnedDeployment, StopPolicy,
    Strategy, WindowState,
};
use crate::rules::move_window::{OwnDeployment, SAVED_REPLICAS_ANNOTATION};
use crate::rules::selector::Selector;

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

/// Scale one Deployment to 0, saving its count in the annotation. Returns the saved count.
async fn pin_deployment(c: &Cluster, ns: &str, name: &str, out: &mut dyn Write) -> Result<i32> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    for _attempt in 0..5 {
        let d = api
            .get(name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
        let (patch, saved_now) = match plan::pin_plan(&d) {
            PinPlan::AlreadyPinned(s) => {
                let _ = writeln!(
                    out,
                    "{}: {ns}/{name} already pinned (restores to {s})",
                    c.label
                );
                return Ok(s.0);
            }
            // Pinned, with an annotation nobody can read: leave it for close to report.
            PinPlan::PinnedUnreadable => return Ok(1),
            PinPlan::Save(n) => {
                let mut patch = json!({"metadata": {
                    "resourceVersion": d.metadata.resource_version,
                    "annotations": {SAVED_REPLICAS_ANNOTATION: n.to_string()}
                }});
                if n > 0 {
                    patch["spec"] = json!({"replicas": 0});
                }
                (patch, n)
            }
        };
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                let _ = writeln!(
                    out,
                    "{}: pinned {ns}/{name} to 0 replicas (was {saved_now})",
                    c.label
                );
                return Ok(saved_now);
            }
            // Someone changed it between our read and write: read again.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(api_err(c, format!("pinning Deployment {ns}/{name}"))(e)),
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.clone(),
        message: format!("Deployment {ns}/{name} kept changing under us; run the command again"),
    })
}

/// Wait until the API server enforces the pin's admission policies bound to the window: its
/// policy and parameter caches follow the writes by a moment. A server-side dry run that asks
/// a pinned Deployment (and its scale) for one replica must come back with zero.
async fn wait_policy_in_force(
    c: &Cluster,
    (ns, name): &(String, String),
    out: &mut dyn Write,
) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let ask = Patch::Merge(json!({"spec": {"replicas": 1}}));
    let start = tokio::time::Instant::now();
    loop {
        let d = api
            .patch(name, &dry, &ask)
            .await
            .map_err(api_err(c, format!("dry-run scaling {ns}/{name}")))?;
        let s = api
            .patch_scale(name, &dry, &ask)
            .await
            .map_err(api_err(c, format!("dry-run scaling {ns}/{name}/scale")))?;
        // A Scale at 0 omits `replicas` (omitempty); a Deployment writes it out.
        if d.spec.and_then(|s| s.replicas) == Some(0)
            && s.spec.and_then(|s| s.replicas).unwrap_or(0) == 0
        {
            let _ = writeln!(
                out,
                "{}: pinned in the API server: a dry run asking {ns}/{name} (and its scale) for 1 replica comes back at 0",
                c.label
            );
            return Ok(());
        }
        if start.elapsed() >= Duration::from_secs(15) {
            let _ = writeln!(
                out,
                "warning: {}: after 15s a dry run of {ns}/{name} at 1 replica is still not pinned by the API server's admission policies; the webhook pins meanwhile, if it runs",
                c.label
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Pods of the given Deployments that still exist (terminating ones included).
async fn remaining_pods(c: &Cluster, keys: &[(String, String)]) -> Result<Vec<(String, usize)>> {
    let mut left = Vec::new();
    for (ns, name) in keys {
        let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
        let Some(sel) = d
            .as_ref()
            .and_then(|d| d.spec.as_ref())
            .map(|s| &s.selector)
        else {
            continue;
        };
        let sel = Selector::from_label_selector(sel).map_err(|e| WindowError::Refused {
            cluster: c.label.clone(),
            message: format!("Deployment {ns}/{name}: {e}"),
        })?;
        if sel.0.is_empty() {
            continue;
        }
        let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
            .list(&ListParams::default().labels(&sel.to_string()))
            .await
            .map_err(api_err(c, format!("listing pods of {ns}/{name}")))?;
        if !pods.items.is_empty() {
            left.push((format!("{ns}/{name}"), pods.items.len()));
        }
    }
    Ok(left)
}

async fn wait_pods_gone(
    clusters: &[(Cluster, Vec<(String, String)>)],
    opts: &OpenOptions,
    out: &mut dyn Write,
) -> Result<()> {
    let start = tokio::time::Instant::now();
    let mut last = String::new();
    loop {
        let mut waiting = Vec::new();
        for (c, keys) in clusters {
            for (d, n) in remaining_pods(c, keys).await? {
                waiting.push(format!("{}: {d} ({n} pods)", c.label));
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let line = waiting.join(", ");
        if line != last {
            let _ = writeln!(out, "waiting for pods to be gone: {line}");
            last = line;
        }
        if start.elapsed() >= opts.wait_timeout {
            return Err(WindowError::Timeout {
                cluster: labels(clusters.iter().map(|(c, _)| c)),
                after: opts.wait_timeout,
                what: format!("waiting for pods to be gone ({last})"),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// How `open` will stop one selected Deployment on one cluster.
#[derive(Debug, Clone)]
pub struct Choice {
    pub namespace: String,
    pub name: String,
    /// `spec.replicas` now.
    pub replicas: i32,
    pub plan: Stop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// These Leases, as seen now.
    Lease(Vec<LeaseSeen>),
    Scale(PinPlan),
}

impl Choice {
    fn what(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Whether the preflight's `finding` is about a Deployment stopped by Lease (its webhooks keep
/// serving).
fn leased(choices: &[Choice], finding: &Finding) -> bool {
    choices
        .iter()
        .any(|ch| ch.what() == finding.deployment && matches!(ch.plan, Stop::Lease(_)))
}

/// Read what `open` needs to choose, and choose (nothing is written): every selected
/// Deployment, the Leases of their namespaces, and what the window already recorded.
pub async fn choose(
    c: &Cluster,
    opts: &OpenOptions,
) -> Result<(Selector, StopPolicy, Vec<Choice>)> {
    let (selector, policy, recorded) = in_force(c, opts).await?;
    let deployments = selected_deployments(c, &selector, &opts.own).await?;
    let mut by_ns: BTreeMap<String, Vec<LeaseSeen>> = BTreeMap::new();
    let mut out = Vec::new();
    for d in deployments {
        let (ns, name) = dep_key(&d);
        if !by_ns.contains_key(&ns) {
            by_ns.insert(ns.clone(), lease::leases_in(c, &ns).await?);
        }
        let leases = &by_ns[&ns];
        let claims = plan::claims(&name, leases, &opts.name);
        let rec = recorded
            .iter()
            .find(|p| p.namespace == ns && p.name == name);
        let what = format!("{ns}/{name}");
        let stop = match plan::choose_stop(policy, &what, rec, &claims) {
            StopChoice::Refuse(message) => {
                return Err(WindowError::Refused {
                    cluster: c.label.clone(),
                    message,
                });
            }
            StopChoice::Scale => Stop::Scale(plan::pin_plan(&d)),
            StopChoice::Lease(names) => {
                let mut seen = Vec::new();
                for n in names {
                    match leases.iter().find(|l| l.name == n) {
                        Some(l) => seen.push(l.clone()),
                        // Recorded by an earlier run, deleted since: a candidate re-creates
                        // it, and the next run takes it from there.
                        None => {
                            return Err(WindowError::Refused {
                                cluster: c.label.clone(),
                                message: format!(
                                    "{what}: the window recorded Lease {ns}/{n}, which no longer exists; wait until a replica re-creates it (it leads meanwhile) and run the command again"
                                ),
                            });
                        }
                    }
                }
                Stop::Lease(seen)
            }
        };
        out.push(Choice {
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            namespace: ns,
            name,
            plan: stop,
        });
    }
    Ok((selector, policy, out))
}

/// The record `open` writes for a Lease-stopped Deployment before it takes anything.
fn leased_record(ch: &Choice) -> Option<PinnedDeployment> {
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
async fn take_leases(
    c: &Cluster,
    opts: &OpenOptions,
    ch: &Choice,
    operator: &str,
    out: &mut dyn Write,
) -> Result<Vec<HeldLease>> {
    let Stop::Lease(leases) = &ch.plan else {
        return Ok(vec![]);
    };
    let mut held = Vec::new();
    for l in leases {
        let mut h = lease::take(c, &ch.namespace, &l.name, &opts.name, operator, out).await?;
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
    Ok(held)
}

/// When every former leader of these Leases is proven stopped.
fn proven_at(held: &[HeldLease]) -> Timestamp {
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

/// What `open` would do on each cluster, read without writing anything: the preflight, the
/// window it would create or re-open, and how it would stop each Deployment.
pub async fn plan_open(
    clusters: &[Cluster],
    opts: &OpenOptions,
    out: &mut dyn Write,
) -> Result<()> {
    for c in clusters {
        let (selector, policy, choices) = choose(c, opts).await?;
        let findings = preflight(c, &selector, &opts.own).await?;
        let window = match &read_window(c, &opts.name).await? {
            None => format!("would create MoveWindow {} (Open)", opts.name),
            Some(w) if w.spec.is_open() => format!("MoveWindow {} is already open", opts.name),
            Some(_) => format!("would re-open MoveWindow {}", opts.name),
        };
        let _ = writeln!(
            out,
            "{}: {window}, selecting {selector}, stopping by {policy:?}",
            c.label
        );
        for f in &findings {
            let verdict = match (leased(&choices, f), opts.allow_webhook_outage) {
                (true, _) => "stopped by Lease: its webhooks keep serving",
                (false, true) => "allowed by --allow-webhook-outage",
                (false, false) => "open would refuse without --allow-webhook-outage",
            };
            let _ = writeln!(out, "{}: preflight: {f} ({verdict})", c.label);
        }
        if choices.is_empty() {
            let _ = writeln!(out, "{}: no Deployment matches {selector}", c.label);
        }
        for ch in &choices {
            let what = match &ch.plan {
                Stop::Lease(leases) => leases
                    .iter()
                    .map(|l| match l.window() {
                        Some(_) => format!(
                            "Lease: {} already held (taken from {})",
                            l.name,
                            l.former_holder.as_deref().unwrap_or("?")
                        ),
                        None => format!(
                            "Lease: would hold {} (held by {}, leaseDurationSeconds {})",
                            l.name,
                            if l.holder.is_empty() {
                                "nobody"
                            } else {
                                &l.holder
                            },
                            l.duration.unwrap_or(plan::DEFAULT_LEASE_SECONDS)
                        ),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                Stop::Scale(PinPlan::AlreadyPinned(s)) => {
                    format!("Scale: already pinned (restores to {s})")
                }
                Stop::Scale(PinPlan::PinnedUnreadable) => format!(
                    "Scale: already at 0 with an unreadable {SAVED_REPLICAS_ANNOTATION} (close would restore 1)"
                ),
                Stop::Scale(PinPlan::Save(0)) => "Scale: already at 0: would save 0".to_string(),
                Stop::Scale(PinPlan::Save(n)) => {
                    format!("Scale: would pin to 0 replicas, saving {n}")
                }
            };
            let _ = writeln!(out, "{}: {}: {what}", c.label, ch.what());
        }
    }
    let _ = writeln!(out, "dry run: nothing was written");
    Ok(())
}

/// What `open` will act by on this cluster, read without writing anything: the selector and
/// stop policy in force (an existing window's own, else the flags, else the defaults) and what
/// the window already recorded.
async fn in_force(
    c: &Cluster,
    opts: &OpenOptions,
) -> Result<(Selector, StopPolicy, Vec<PinnedDeployment>)> {
    let refused = |message: String| WindowError::Refused {
        cluster: c.label.clone(),
        message,
    };
    let Some(w) = read_window(c, &opts.name).await? else {
        let selector = match &opts.selector {
            Some(sel) => Selector::from_label_selector(sel)
                .map_err(|e| refused(format!("--selector: {e}")))?,
            None => MoveWindowSpec::default_selector(),
        };
        return Ok((selector, opts.stop.unwrap_or_default(), vec![]));
    };
    if let Some(sel) = &opts.selector
        && w.spec.deployment_selector.as_ref() != Some(sel)
    {
        return Err(refused(format!(
            "MoveWindow {} already exists with another deploymentSelector; close it and delete it, or open it without --selector",
            opts.name
        )));
    }
    let policy = w.spec.stop.unwrap_or_default();
    if let Some(stop) = opts.stop
        && stop != policy
    {
        return Err(refused(format!(
            "MoveWindow {} already exists with spec.stop {policy:?}; close it and delete it, or open it without --stop",
            opts.name
        )));
    }
    let selector = w
        .spec
        .selector()
        .map_err(|e| refused(format!("MoveWindow {}: {e}", opts.name)))?;
    // A window closed since recorded history, not a plan to finish.
    let recorded = match w.spec.is_open() {
        true => w.status.map(|s| s.pinned).unwrap_or_default(),
        false => vec![],
    };
    Ok((selector, policy, recorded))
}
