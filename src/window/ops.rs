//! `handoff window open|close|status`, against one cluster or both clusters of a move.
//!
//! Every step reads what the cluster already holds before it writes, and records what it did
//! in the window's status, so a command that died midway is finished by running it again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::{Timestamp, Unit};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde_json::json;

use crate::policy::move_window::{OwnDeployment, SAVED_REPLICAS_ANNOTATION, SavedReplicas};
use crate::policy::selector::Selector;
use crate::resources::move_window::{
    MoveRole, MoveWindow, MoveWindowSpec, MoveWindowStatus, PinnedDeployment, WindowState,
};

/// One cluster a command acts on.
#[derive(Clone)]
pub struct Cluster {
    /// `cluster`, `source` or `target`, for messages.
    pub label: String,
    pub client: kube::Client,
    pub role: Option<MoveRole>,
}

#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("{cluster}: {action}: {source}")]
    Api {
        cluster: String,
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "preflight: pinning these Deployments stops webhooks that fail closed, so API requests they serve will be rejected until the window closes:\n{}\nre-run with --allow-webhook-outage to open the window anyway",
        .0.iter().map(|f| format!("  {f}")).collect::<Vec<_>>().join("\n")
    )]
    Preflight(Vec<Finding>),
    #[error("{cluster}: {message}")]
    Refused { cluster: String, message: String },
    #[error(
        "{cluster}: timed out after {after:?} {what}; the window stays as it is: run the same command again to resume"
    )]
    Timeout {
        cluster: String,
        after: Duration,
        what: String,
    },
}

type Result<T> = std::result::Result<T, WindowError>;

fn api_err(c: &Cluster, action: impl Into<String>) -> impl FnOnce(kube::Error) -> WindowError {
    let cluster = c.label.clone();
    let action = action.into();
    move |source| WindowError::Api {
        cluster,
        action,
        source,
    }
}

fn now() -> String {
    Timestamp::now()
        .round(Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| Timestamp::now().to_string())
}

/// A Deployment whose pods back a webhook that fails closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub cluster: String,
    pub deployment: String,
    pub service: String,
    pub hook: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: Deployment {} backs Service {}, used by {}",
            self.cluster, self.deployment, self.service, self.hook
        )
    }
}

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
}

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
}

fn dep_key(d: &Deployment) -> (String, String) {
    (
        d.metadata.namespace.clone().unwrap_or_default(),
        d.metadata.name.clone().unwrap_or_default(),
    )
}

async fn selected_deployments(
    c: &Cluster,
    selector: &Selector,
    own: &OwnDeployment,
) -> Result<Vec<Deployment>> {
    let api: Api<Deployment> = Api::all(c.client.clone());
    let list = api
        .list(&ListParams::default().labels(&selector.to_string()))
        .await
        .map_err(api_err(c, "listing Deployments"))?;
    let mut items: Vec<Deployment> = list
        .items
        .into_iter()
        // The API server filtered already; filtering again guards against a server that
        // ignored the selector, since pinning the wrong controller is not undoable.
        .filter(|d| selector.matches(d.metadata.labels.as_ref()))
        .filter(|d| {
            let (ns, name) = dep_key(d);
            !(ns == own.namespace && name == own.name)
        })
        .collect();
    items.sort_by_key(dep_key);
    Ok(items)
}

/// Every selected Deployment whose pods back a webhook or conversion Service that fails closed.
pub async fn preflight(
    c: &Cluster,
    selector: &Selector,
    own: &OwnDeployment,
) -> Result<Vec<Finding>> {
    let deployments = selected_deployments(c, selector, own).await?;
    if deployments.is_empty() {
        return Ok(vec![]);
    }
    // (namespace, service) → the hooks that call it and fail closed.
    let mut hooks: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    // Both kinds of webhook configuration, flattened to (configuration, webhook, policy,
    // service) so one loop judges them.
    let mut webhooks = Vec::new();
    let vwc: Api<ValidatingWebhookConfiguration> = Api::all(c.client.clone());
    for cfg in vwc
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing ValidatingWebhookConfigurations"))?
    {
        let cfg_name = cfg.metadata.name.clone().unwrap_or_default();
        for w in cfg.webhooks.into_iter().flatten() {
            let kind = format!("ValidatingWebhookConfiguration {cfg_name}");
            webhooks.push((kind, w.name, w.failure_policy, w.client_config.service));
        }
    }
    let mwc: Api<MutatingWebhookConfiguration> = Api::all(c.client.clone());
    for cfg in mwc
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing MutatingWebhookConfigurations"))?
    {
        let cfg_name = cfg.metadata.name.clone().unwrap_or_default();
        for w in cfg.webhooks.into_iter().flatten() {
            let kind = format!("MutatingWebhookConfiguration {cfg_name}");
            webhooks.push((kind, w.name, w.failure_policy, w.client_config.service));
        }
    }
    for (cfg, name, policy, service) in webhooks {
        // admissionregistration/v1 defaults failurePolicy to Fail.
        if policy.as_deref().unwrap_or("Fail") != "Fail" {
            continue;
        }
        if let Some(s) = service {
            hooks
                .entry((s.namespace, s.name))
                .or_default()
                .push(format!("{cfg} webhook {name} (failurePolicy Fail)"));
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    for crd in crds
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing CustomResourceDefinitions"))?
    {
        let Some(conv) = crd.spec.conversion.as_ref() else {
            continue;
        };
        if conv.strategy != "Webhook" {
            continue;
        }
        if let Some(s) = conv
            .webhook
            .as_ref()
            .and_then(|w| w.client_config.as_ref())
            .and_then(|cc| cc.service.as_ref())
        {
            hooks
                .entry((s.namespace.clone(), s.name.clone()))
                .or_default()
                .push(format!(
                    "CustomResourceDefinition {} conversion webhook (conversion always fails closed)",
                    crd.metadata.name.clone().unwrap_or_default()
                ));
        }
    }
    let mut findings = Vec::new();
    let namespaces: BTreeSet<String> = deployments.iter().map(|d| dep_key(d).0).collect();
    for ns in namespaces {
        let services: Api<Service> = Api::namespaced(c.client.clone(), &ns);
        let services = services
            .list(&ListParams::default())
            .await
            .map_err(api_err(c, format!("listing Services in {ns}")))?;
        for svc in services {
            let svc_name = svc.metadata.name.clone().unwrap_or_default();
            let Some(callers) = hooks.get(&(ns.clone(), svc_name.clone())) else {
                continue;
            };
            let Some(sel) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
                continue;
            };
            if sel.is_empty() {
                continue;
            }
            for d in deployments.iter().filter(|d| dep_key(d).0 == ns) {
                let pod_labels = d
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
                    .and_then(|m| m.labels.as_ref());
                let backs =
                    pod_labels.is_some_and(|l| sel.iter().all(|(k, v)| l.get(k) == Some(v)));
                if backs {
                    for hook in callers {
                        findings.push(Finding {
                            cluster: c.label.clone(),
                            deployment: format!("{ns}/{}", dep_key(d).1),
                            service: format!("{ns}/{svc_name}"),
                            hook: hook.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(findings)
}

/// Read the window, change its status with `f`, write the status back.
async fn record(
    c: &Cluster,
    name: &str,
    f: impl Fn(&mut MoveWindowStatus),
) -> Result<MoveWindowStatus> {
    let api: Api<MoveWindow> = Api::all(c.client.clone());
    // Read-modify-write guarded by resourceVersion: a concurrent run of another command makes
    // this one read again instead of overwriting what the other recorded.
    for _attempt in 0..5 {
        let w = api
            .get(name)
            .await
            .map_err(api_err(c, format!("reading MoveWindow {name}")))?;
        let mut status = w.status.unwrap_or_default();
        f(&mut status);
        status.pinned_count = status.pinned.len() as i32;
        let mut body = serde_json::to_value(&status).expect("status serializes");
        // A merge patch leaves out what it does not mention: clear unset fields explicitly.
        for field in ["phase", "openedAt", "podsGoneAt", "closedAt", "lastStep"] {
            body.as_object_mut()
                .expect("status is an object")
                .entry(field)
                .or_insert(serde_json::Value::Null);
        }
        body["pinned"] = serde_json::to_value(&status.pinned).expect("pinned serializes");
        let patch = json!({
            "metadata": {"resourceVersion": w.metadata.resource_version},
            "status": body
        });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return Ok(status),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                return Err(api_err(c, format!("recording status of MoveWindow {name}"))(e));
            }
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.clone(),
        message: format!("MoveWindow {name} kept changing under us; run the command again"),
    })
}

fn upsert_pinned(status: &mut MoveWindowStatus, entry: PinnedDeployment) {
    match status
        .pinned
        .iter_mut()
        .find(|p| p.namespace == entry.namespace && p.name == entry.name)
    {
        Some(p) => *p = entry,
        None => {
            status.pinned.push(entry);
            status
                .pinned
                .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        }
    }
}

/// Create the window, or re-open an existing one; returns the selector in force, and whether
/// the pin's admission policies are bound to it.
async fn ensure_open(
    c: &Cluster,
    opts: &OpenOptions,
    out: &mut dyn Write,
) -> Result<(Selector, bool)> {
    let api: Api<MoveWindow> = Api::all(c.client.clone());
    let existing = api
        .get_opt(&opts.name)
        .await
        .map_err(api_err(c, format!("reading MoveWindow {}", opts.name)))?;
    let spec = match existing {
        None => {
            let spec = MoveWindowSpec {
                state: WindowState::Open,
                deployment_selector: opts.selector.clone(),
                reason: opts.reason.clone(),
                role: c.role,
            };
            let w = MoveWindow::new(&opts.name, spec.clone());
            api.create(&PostParams::default(), &w)
                .await
                .map_err(api_err(c, format!("creating MoveWindow {}", opts.name)))?;
            let _ = writeln!(out, "{}: created MoveWindow {} (Open)", c.label, opts.name);
            spec
        }
        Some(w) => {
            if let Some(sel) = &opts.selector
                && w.spec.deployment_selector.as_ref() != Some(sel)
            {
                return Err(WindowError::Refused {
                    cluster: c.label.clone(),
                    message: format!(
                        "MoveWindow {} already exists with another deploymentSelector; close it and delete it, or open it without --selector",
                        opts.name
                    ),
                });
            }
            if w.spec.state != WindowState::Open {
                api.patch(
                    &opts.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"state": "Open"}})),
                )
                .await
                .map_err(api_err(c, format!("re-opening MoveWindow {}", opts.name)))?;
                let _ = writeln!(out, "{}: re-opened MoveWindow {}", c.label, opts.name);
            } else {
                let _ = writeln!(out, "{}: MoveWindow {} is already open", c.label, opts.name);
            }
            w.spec
        }
    };
    let selector = spec.selector().map_err(|e| WindowError::Refused {
        cluster: c.label.clone(),
        message: format!("MoveWindow {}: {e}", opts.name),
    })?;
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
    })
    .await?;
    Ok((selector, bound))
}

/// Scale one Deployment to 0, saving its count in the annotation. Returns the saved count.
/// What pinning a Deployment comes to, read from the Deployment alone: `open` acts on it,
/// `open --dry-run` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PinPlan {
    /// At 0 with a readable saved count: nothing to write.
    AlreadyPinned(SavedReplicas),
    /// At 0 with an annotation nobody can read: left for `close` to report (restores 1).
    PinnedUnreadable,
    /// Save this count (0 when it already stands at 0) and scale to 0.
    Save(i32),
}

fn pin_plan(d: &Deployment) -> PinPlan {
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let annotation = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION));
    match (replicas, annotation.map(|a| SavedReplicas::parse(a))) {
        (0, Some(Some(s))) => PinPlan::AlreadyPinned(s),
        (0, Some(None)) => PinPlan::PinnedUnreadable,
        (n, _) => PinPlan::Save(n),
    }
}

async fn pin_deployment(c: &Cluster, ns: &str, name: &str, out: &mut dyn Write) -> Result<i32> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    for _attempt in 0..5 {
        let d = api
            .get(name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
        let (patch, saved_now) = match pin_plan(&d) {
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

/// Open steps 1–3 on one cluster (preflight happens before, for every cluster).
/// Pin every Deployment the window selects on one cluster, recording each.
async fn pin_selected(
    c: &Cluster,
    opts: &OpenOptions,
    selector: &Selector,
    out: &mut dyn Write,
) -> Result<Vec<(String, String)>> {
    let deployments = selected_deployments(c, selector, &opts.own).await?;
    if deployments.is_empty() {
        let _ = writeln!(out, "{}: no Deployment matches {selector}", c.label);
    }
    let mut keys = Vec::new();
    for d in &deployments {
        let (ns, name) = dep_key(d);
        let saved = pin_deployment(c, &ns, &name, out).await?;
        record(c, &opts.name, |s| {
            upsert_pinned(
                s,
                PinnedDeployment {
                    namespace: ns.clone(),
                    name: name.clone(),
                    saved_replicas: saved,
                    restored_at: None,
                    note: None,
                },
            );
            s.last_step = Some(format!("pinned {ns}/{name}"));
        })
        .await?;
        keys.push((ns, name));
    }
    Ok(keys)
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
                cluster: clusters
                    .iter()
                    .map(|(c, _)| c.label.as_str())
                    .collect::<Vec<_>>()
                    .join("+"),
                after: opts.wait_timeout,
                what: format!("waiting for pods to be gone ({last})"),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// Open a window on every cluster: preflight all, then create and pin on each (source first),
/// then wait until the pinned pods are gone everywhere.
pub async fn open(clusters: &[Cluster], opts: &OpenOptions, out: &mut dyn Write) -> Result<()> {
    // The selector in force on each cluster: an existing window's own (it is what will be
    // pinned), else --selector, else the Cluster API default. Preflight checks exactly that.
    let mut selectors = Vec::new();
    for c in clusters {
        selectors.push(selector_in_force(c, opts).await?);
    }
    let mut findings = Vec::new();
    for (c, selector) in clusters.iter().zip(&selectors) {
        findings.extend(preflight(c, selector, &opts.own).await?);
    }
    if !findings.is_empty() {
        if !opts.allow_webhook_outage {
            return Err(WindowError::Preflight(findings));
        }
        for f in &findings {
            let _ = writeln!(out, "warning: {f} (allowed by --allow-webhook-outage)");
        }
    }
    // Every window exists and is open before any Deployment is pinned anywhere, so a cluster
    // that fails here leaves no controller stopped without a window to close.
    let mut in_force = Vec::new();
    for c in clusters {
        in_force.push(ensure_open(c, opts, out).await?);
    }
    let mut opened = Vec::new();
    for (c, (selector, bound)) in clusters.iter().zip(&in_force) {
        let keys = pin_selected(c, opts, selector, out).await?;
        if let (true, Some(first)) = (bound, keys.first()) {
            wait_policy_in_force(c, first, out).await?;
        }
        opened.push((c.clone(), keys));
    }
    if !opts.wait_timeout.is_zero() {
        wait_pods_gone(&opened, opts, out).await?;
    }
    for (c, _) in &opened {
        record(c, &opts.name, |s| {
            s.phase = Some("Open".into());
            if !opts.wait_timeout.is_zero() {
                s.pods_gone_at.get_or_insert_with(now);
            }
            s.last_step = Some("pods-gone".into());
        })
        .await?;
        let _ = writeln!(out, "{}: MoveWindow {} is open", c.label, opts.name);
    }
    Ok(())
}

/// What `open` would do on each cluster, read without writing anything: the preflight, the
/// window it would create or re-open, and each Deployment it would pin with the count it would
/// save.
pub async fn plan_open(
    clusters: &[Cluster],
    opts: &OpenOptions,
    out: &mut dyn Write,
) -> Result<()> {
    for c in clusters {
        let selector = selector_in_force(c, opts).await?;
        let findings = preflight(c, &selector, &opts.own).await?;
        let existing = Api::<MoveWindow>::all(c.client.clone())
            .get_opt(&opts.name)
            .await
            .map_err(api_err(c, format!("reading MoveWindow {}", opts.name)))?;
        let window = match &existing {
            None => format!("would create MoveWindow {} (Open)", opts.name),
            Some(w) if w.spec.is_open() => format!("MoveWindow {} is already open", opts.name),
            Some(_) => format!("would re-open MoveWindow {}", opts.name),
        };
        let _ = writeln!(out, "{}: {window}, selecting {selector}", c.label);
        for f in &findings {
            let verdict = match opts.allow_webhook_outage {
                true => "allowed by --allow-webhook-outage",
                false => "open would refuse without --allow-webhook-outage",
            };
            let _ = writeln!(out, "{}: preflight: {f} ({verdict})", c.label);
        }
        let deployments = selected_deployments(c, &selector, &opts.own).await?;
        if deployments.is_empty() {
            let _ = writeln!(out, "{}: no Deployment matches {selector}", c.label);
        }
        for d in &deployments {
            let (ns, name) = dep_key(d);
            let plan = match pin_plan(d) {
                PinPlan::AlreadyPinned(s) => format!("already pinned (restores to {s})"),
                PinPlan::PinnedUnreadable => format!(
                    "already at 0 with an unreadable {SAVED_REPLICAS_ANNOTATION} (close would restore 1)"
                ),
                PinPlan::Save(0) => "already at 0: would save 0".to_string(),
                PinPlan::Save(n) => format!("would pin to 0 replicas, saving {n}"),
            };
            let _ = writeln!(out, "{}: {ns}/{name}: {plan}", c.label);
        }
    }
    let _ = writeln!(out, "dry run: nothing was written");
    Ok(())
}

/// The selector `open` will pin with on this cluster, read without writing anything.
async fn selector_in_force(c: &Cluster, opts: &OpenOptions) -> Result<Selector> {
    let refused = |message: String| WindowError::Refused {
        cluster: c.label.clone(),
        message,
    };
    let existing = Api::<MoveWindow>::all(c.client.clone())
        .get_opt(&opts.name)
        .await
        .map_err(api_err(c, format!("reading MoveWindow {}", opts.name)))?;
    match (existing, &opts.selector) {
        (Some(w), Some(sel)) if w.spec.deployment_selector.as_ref() != Some(sel) => {
            Err(refused(format!(
                "MoveWindow {} already exists with another deploymentSelector; close it and delete it, or open it without --selector",
                opts.name
            )))
        }
        (Some(w), _) => w
            .spec
            .selector()
            .map_err(|e| refused(format!("MoveWindow {}: {e}", opts.name))),
        (None, Some(sel)) => {
            Selector::from_label_selector(sel).map_err(|e| refused(format!("--selector: {e}")))
        }
        (None, None) => Ok(MoveWindowSpec::default_selector()),
    }
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
    pub replicas: i32,
    pub note: Option<String>,
}

/// `None` when the cluster has no such window.
async fn close_one(
    c: &Cluster,
    opts: &CloseOptions,
    out: &mut dyn Write,
) -> Result<Option<Vec<Restored>>> {
    let api: Api<MoveWindow> = Api::all(c.client.clone());
    let Some(w) = api
        .get_opt(&opts.name)
        .await
        .map_err(api_err(c, format!("reading MoveWindow {}", opts.name)))?
    else {
        let _ = writeln!(
            out,
            "{}: there is no MoveWindow {}: nothing to close here",
            c.label, opts.name
        );
        return Ok(None);
    };
    // Closed first: from here on the webhook lets restores through.
    if w.spec.state != WindowState::Closed {
        api.patch(
            &opts.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"state": "Closed"}})),
        )
        .await
        .map_err(api_err(c, format!("closing MoveWindow {}", opts.name)))?;
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
        if s.phase.as_deref() != Some("Closed") {
            s.phase = Some("Closing".into());
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
    let others: Vec<(String, Selector)> = api
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
        .filter(|(_, p)| p.restored_at.is_none())
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
        let (count, note) = match (
            annotation.as_deref().map(SavedReplicas::parse),
            record_entry,
        ) {
            (Some(Some(s)), _) => (s.0, None),
            // The annotation is gone but this window recorded the count: a run that died
            // after restoring (this step records before it writes), or a client that removed
            // it. The record is the better truth than a guess of 1.
            (None, Some(p)) => (p.saved_replicas, p.note.clone()),
            (Some(None), _) => (
                1,
                Some(format!(
                    "annotation {SAVED_REPLICAS_ANNOTATION}={:?} is unreadable; restored to 1",
                    annotation.unwrap_or_default()
                )),
            ),
            (None, None) => (1, Some("no saved count anywhere; restored to 1".into())),
        };
        // Record what we are about to do, so a re-run after the annotation is gone knows.
        record(c, &opts.name, |s| {
            upsert_pinned(
                s,
                PinnedDeployment {
                    namespace: ns.clone(),
                    name: name.clone(),
                    saved_replicas: count,
                    restored_at: None,
                    note: note.clone(),
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
            replicas: count,
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
    record(c, &opts.name, |s| {
        s.phase = Some("Closed".into());
        s.closed_at.get_or_insert_with(now);
        s.last_step = Some("restored".into());
    })
    .await?;
    Ok(Some(restored))
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
            cluster: clusters
                .iter()
                .map(|c| c.label.as_str())
                .collect::<Vec<_>>()
                .join("+"),
            message: format!("there is no MoveWindow {}: nothing to close", opts.name),
        });
    }
    Ok(all)
}

/// One window as `status` shows it, with the live state of its Deployments.
#[derive(Debug, Clone, Serialize)]
pub struct WindowView {
    pub cluster: String,
    pub name: String,
    pub state: WindowState,
    pub phase: Option<String>,
    pub role: Option<MoveRole>,
    pub reason: Option<String>,
    pub created: Option<String>,
    pub last_step: Option<String>,
    pub deployments: Vec<DeploymentView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeploymentView {
    pub namespace: String,
    pub name: String,
    /// `spec.replicas` now.
    pub replicas: Option<i32>,
    /// The annotation now.
    pub saved_annotation: Option<String>,
    /// What the window recorded.
    pub recorded: Option<i32>,
    pub restored_at: Option<String>,
    pub note: Option<String>,
}

pub async fn status(
    clusters: &[Cluster],
    name: Option<&str>,
    own: &OwnDeployment,
) -> Result<Vec<WindowView>> {
    let mut views = Vec::new();
    for c in clusters {
        let api: Api<MoveWindow> = Api::all(c.client.clone());
        let windows = match name {
            Some(n) => api
                .get_opt(n)
                .await
                .map_err(api_err(c, format!("reading MoveWindow {n}")))?
                .into_iter()
                .collect::<Vec<_>>(),
            None => {
                api.list(&ListParams::default())
                    .await
                    .map_err(api_err(c, "listing MoveWindows"))?
                    .items
            }
        };
        for w in windows {
            let status = w.status.clone().unwrap_or_default();
            let mut keys: BTreeSet<(String, String)> = status
                .pinned
                .iter()
                .map(|p| (p.namespace.clone(), p.name.clone()))
                .collect();
            if w.spec.is_open()
                && let Ok(sel) = w.spec.selector()
            {
                for d in selected_deployments(c, &sel, own).await? {
                    keys.insert(dep_key(&d));
                }
            }
            let mut deployments = Vec::new();
            for (ns, dname) in keys {
                let d = Api::<Deployment>::namespaced(c.client.clone(), &ns)
                    .get_opt(&dname)
                    .await
                    .map_err(api_err(c, format!("reading Deployment {ns}/{dname}")))?;
                let rec = status
                    .pinned
                    .iter()
                    .find(|p| p.namespace == ns && p.name == dname);
                deployments.push(DeploymentView {
                    replicas: d.as_ref().and_then(|d| d.spec.as_ref()?.replicas),
                    saved_annotation: d.as_ref().and_then(|d| {
                        d.metadata
                            .annotations
                            .as_ref()?
                            .get(SAVED_REPLICAS_ANNOTATION)
                            .cloned()
                    }),
                    recorded: rec.map(|p| p.saved_replicas),
                    restored_at: rec.and_then(|p| p.restored_at.clone()),
                    note: rec.and_then(|p| p.note.clone()),
                    namespace: ns,
                    name: dname,
                });
            }
            views.push(WindowView {
                cluster: c.label.clone(),
                name: w.metadata.name.clone().unwrap_or_default(),
                state: w.spec.state,
                phase: status.phase.clone(),
                role: w.spec.role,
                reason: w.spec.reason.clone(),
                created: w
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string()),
                last_step: status.last_step.clone(),
                deployments,
            });
        }
    }
    Ok(views)
}

/// The `status` table.
pub fn render_table(views: &[WindowView]) -> String {
    let mut s = String::new();
    if views.is_empty() {
        return "no MoveWindows\n".into();
    }
    let dash = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    for v in views {
        s.push_str(&format!(
            "{:<8} {:<24} {:<7} {:<8} {:<7} {}\n",
            "CLUSTER", "WINDOW", "STATE", "PHASE", "ROLE", "REASON"
        ));
        s.push_str(&format!(
            "{:<8} {:<24} {:<7} {:<8} {:<7} {}\n",
            v.cluster,
            v.name,
            format!("{:?}", v.state),
            dash(v.phase.clone()),
            dash(v.role.map(|r| format!("{r:?}").to_lowercase())),
            dash(v.reason.clone()),
        ));
        if v.deployments.is_empty() {
            s.push_str("  (no Deployments pinned)\n\n");
            continue;
        }
        s.push_str(&format!(
            "  {:<56} {:>8} {:>6} {:>8}  {}\n",
            "DEPLOYMENT", "REPLICAS", "SAVED", "RECORDED", "RESTORED"
        ));
        for d in &v.deployments {
            s.push_str(&format!(
                "  {:<56} {:>8} {:>6} {:>8}  {}{}\n",
                format!("{}/{}", d.namespace, d.name),
                dash(d.replicas.map(|r| r.to_string())),
                dash(d.saved_annotation.clone()),
                dash(d.recorded.map(|r| r.to_string())),
                dash(d.restored_at.clone()),
                d.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default(),
            ));
        }
        s.push('\n');
    }
    s
}
