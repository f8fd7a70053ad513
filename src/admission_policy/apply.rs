//! `handoff policy install | uninstall | show`, the parameter publisher that `handoff serve`
//! runs, and the window bindings that `handoff window open | close` manage: the I/O around
//! the pure renderings of `admission_policy`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind, PartialObjectMeta};
use serde_json::Value;

use super::*;
use crate::resources::move_window::{MoveWindow, default_deployment_selector};
use crate::rules::identity::{Identities, Located};
use crate::rules::move_window::OwnDeployment;
use crate::rules::rollout::Rollout;
use crate::rules::sync_finalizer::NamespaceMeta;

const GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";

/// Which admission policy APIs the cluster serves, read from discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub validating: bool,
    pub mutating: bool,
    /// The MoveWindow CRD, the pin's parameter kind.
    pub move_windows: bool,
}

pub async fn served(client: &kube::Client) -> Result<Served, kube::Error> {
    let resources = match client.list_api_group_resources(GROUP_VERSION).await {
        Ok(list) => list.resources,
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    let has = |name: &str| resources.iter().any(|r| r.name == name);
    let move_windows = match client
        .list_api_group_resources("handoff.dev/v1alpha1")
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.name == "movewindows"),
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => return Err(e),
    };
    Ok(Served {
        validating: has("validatingadmissionpolicies") && has("validatingadmissionpolicybindings"),
        mutating: has("mutatingadmissionpolicies") && has("mutatingadmissionpolicybindings"),
        move_windows,
    })
}

/// An `admissionregistration.k8s.io/v1` kind's API.
pub fn resource(kind: &str) -> ApiResource {
    let lower = kind.to_ascii_lowercase();
    let plural = match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        &plural,
    )
}

fn api_for(client: &kube::Client, obj: &Value) -> (Api<DynamicObject>, String) {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api = if kind == "ConfigMap" {
        let ar = ApiResource::erase::<ConfigMap>(&());
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &resource(kind))
    };
    (api, name)
}

/// Server-side apply, forced: handoff owns these objects' fields.
pub async fn apply(client: &kube::Client, obj: &Value) -> Result<(), kube::Error> {
    let (api, name) = api_for(client, obj);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await?;
    Ok(())
}

/// Read if present (`None` also where the API server does not serve the kind).
pub async fn get(
    client: &kube::Client,
    kind: &str,
    name: &str,
) -> Result<Option<Value>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(kind));
    match api.get_opt(name).await {
        Ok(o) => Ok(o.map(|o| serde_json::to_value(o).unwrap_or_default())),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Delete if present; `true` when something was deleted.
pub async fn delete(client: &kube::Client, obj: &Value) -> Result<bool, kube::Error> {
    let (api, name) = api_for(client, obj);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

fn describe(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// What `handoff policy` is asked to install.
#[derive(Debug, Clone)]
pub struct Install {
    pub ids: Identities,
    pub rollout: Rollout,
    pub params: ParamsRef,
    pub own: OwnDeployment,
}

/// The sync targets the cluster's namespaces name now, hashed as the webhook hashes them.
pub async fn located_in_cluster(
    client: &kube::Client,
    ids: &Identities,
) -> Result<Vec<(String, Arc<Located>)>, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let list = api.list_metadata(&ListParams::default()).await?;
    // Hold every namespace's meta while the located table is read: it keeps weak references.
    let metas: Vec<NamespaceMeta> = list
        .items
        .iter()
        .map(|n: &PartialObjectMeta<Namespace>| {
            NamespaceMeta::from_annotations(n.metadata.annotations.as_ref(), ids)
        })
        .collect();
    let located = ids.located_targets();
    drop(metas);
    Ok(located)
}

/// Everything `install` applies, in the order it applies it, for the APIs the cluster serves
/// (all of them when `served` is `None`: `show` without a cluster).
pub fn objects(
    inst: &Install,
    dir: &Directory,
    served: Served,
    open_windows: &[(String, Option<String>, LabelSelector)],
) -> Vec<Value> {
    let mut out = Vec::new();
    if served.validating {
        // The parameter before the binding that reads it.
        out.push(params_object(&inst.params, &dir.data));
        out.push(guard_policy(&inst.ids, &inst.rollout));
        out.push(guard_binding(&inst.params, inst.rollout.sync_finalizer));
        out.push(lease_hold_policy(&inst.rollout));
        out.push(lease_hold_binding(inst.rollout.move_window));
    }
    if served.mutating && served.move_windows {
        out.push(pin_policy(&inst.own, &inst.rollout));
        out.push(pin_scale_policy(&inst.own, &inst.rollout));
        for (w, uid, sel) in open_windows {
            out.extend(window_bindings(w, uid.as_deref(), sel));
        }
    }
    out
}

/// What stays on the webhook, said plainly, for what the cluster does not serve.
pub fn gaps(served: Served) -> Vec<String> {
    let mut out = Vec::new();
    if !served.validating {
        out.push(format!("this API server does not serve ValidatingAdmissionPolicy ({GROUP_VERSION}, Kubernetes 1.30+): the sync-finalizer guard and the held-Lease guard stay on the webhook alone"));
    }
    if !served.mutating {
        out.push(format!("this API server does not serve MutatingAdmissionPolicy ({GROUP_VERSION}, Kubernetes 1.36+): the move-window pin stays on the webhook alone"));
    } else if !served.move_windows {
        out.push("the MoveWindow CRD is not installed (handoff crd | kubectl apply -f -): the move-window pin's policies, whose parameter is the MoveWindow, are not installed".to_string());
    }
    out
}

async fn open_windows(
    client: &kube::Client,
    served: Served,
) -> Result<Vec<(String, Option<String>, LabelSelector)>, kube::Error> {
    if !served.move_windows {
        return Ok(Vec::new());
    }
    let api: Api<MoveWindow> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter(|w| w.spec.is_open())
        .filter_map(|w| {
            let sel = w
                .spec
                .deployment_selector
                .clone()
                .unwrap_or_else(default_deployment_selector);
            Some((w.metadata.name?, w.metadata.uid, sel))
        })
        .collect())
}

/// Why `handoff policy` could not show, install or uninstall the policies.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "config: these identities cannot be published to the admission policy, which would then never hold them: {}",
        .0.join("; ")
    )]
    Unpublishable(Vec<String>),
    #[error(
        "namespace {0} does not exist: apply the manifests first (kubectl apply -k manifests/overlays/cert-manager), create it, or pass --params NAMESPACE/NAME"
    )]
    NoNamespace(String),
    #[error("rendering YAML: {0}")]
    Yaml(#[from] crate::yaml::YamlError),
}

/// A kube error, said with what was being done.
fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> PolicyError {
    let what = what.into();
    move |source| PolicyError::Api { what, source }
}

/// What `show` prints and `install` applies: the objects and the notes about them.
pub async fn plan(
    client: &kube::Client,
    inst: &Install,
) -> Result<(Vec<Value>, Vec<String>), PolicyError> {
    let served = served(client)
        .await
        .map_err(api_err("reading which admission APIs the cluster serves"))?;
    let located = located_in_cluster(client, &inst.ids)
        .await
        .map_err(api_err("listing namespaces"))?;
    let dir = directory(&inst.ids, &located);
    let windows = open_windows(client, served)
        .await
        .map_err(api_err("listing MoveWindows"))?;
    if !dir.unpublishable.is_empty() {
        return Err(PolicyError::Unpublishable(dir.unpublishable));
    }
    let mut notes = gaps(served);
    notes.extend(
        dir.skipped
            .iter()
            .map(|s| format!("not published (the webhook still resolves it): {s}")),
    );
    Ok((objects(inst, &dir, served, &windows), notes))
}

pub fn render_yaml(objects: &[Value]) -> Result<String, PolicyError> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&crate::yaml::to_string(o)?);
    }
    Ok(out)
}

pub async fn install(
    client: &kube::Client,
    inst: &Install,
    out: &mut dyn std::io::Write,
) -> Result<(), PolicyError> {
    let (objects, notes) = plan(client, inst).await?;
    for n in &notes {
        let _ = writeln!(out, "note: {n}");
    }
    if objects.iter().any(|o| o["kind"] == "ConfigMap") {
        let ns: Api<Namespace> = Api::all(client.clone());
        let namespace = &inst.params.namespace;
        if ns
            .get_opt(namespace)
            .await
            .map_err(api_err(format!("reading namespace {namespace}")))?
            .is_none()
        {
            return Err(PolicyError::NoNamespace(namespace.clone()));
        }
    }
    for o in &objects {
        apply(client, o)
            .await
            .map_err(api_err(format!("applying {}", describe(o))))?;
        let _ = writeln!(out, "applied {}", describe(o));
    }
    if let Some(cm) = objects.iter().find(|o| o["kind"] == "ConfigMap") {
        let n = cm["data"].as_object().map(|d| d.len()).unwrap_or(0);
        let _ = writeln!(
            out,
            "published {n} sync-target identities in ConfigMap {}",
            inst.params
        );
    }
    Ok(())
}

/// Remove everything `install` and `window open` created: bindings first (so that no policy
/// is ever bound without its parameter), then the policies, then the parameter.
pub async fn uninstall(
    client: &kube::Client,
    params: &ParamsRef,
    out: &mut dyn std::io::Write,
) -> Result<(), PolicyError> {
    let served = served(client)
        .await
        .map_err(api_err("reading which admission APIs the cluster serves"))?;
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let mut doomed: Vec<Value> = Vec::new();
    for (served, kinds) in [
        (
            served.validating,
            [
                "ValidatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicy",
            ],
        ),
        (
            served.mutating,
            ["MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy"],
        ),
    ] {
        if !served {
            continue;
        }
        for kind in kinds {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(kind));
            let mut names: Vec<String> = api
                .list_metadata(&ListParams::default().labels(&selector))
                .await
                .map_err(api_err(format!("listing {kind}s")))?
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            // And the fixed names, in case a label was edited away.
            let fixed: &[&str] = match kind {
                "ValidatingAdmissionPolicyBinding" | "ValidatingAdmissionPolicy" => {
                    &[GUARD_POLICY, LEASE_HOLD_POLICY]
                }
                "MutatingAdmissionPolicy" => &[PIN_POLICY, PIN_SCALE_POLICY],
                _ => &[],
            };
            names.extend(fixed.iter().map(|f| f.to_string()));
            names.sort();
            names.dedup();
            for n in names {
                doomed.push(serde_json::json!({"kind": kind, "metadata": {"name": n}}));
            }
        }
    }
    // Bindings before policies.
    doomed.sort_by_key(|o| !o["kind"].as_str().unwrap_or_default().ends_with("Binding"));
    doomed.push(
        serde_json::json!({"kind": "ConfigMap", "metadata": {"name": params.name, "namespace": params.namespace}}),
    );
    for o in &doomed {
        if delete(client, o)
            .await
            .map_err(api_err(format!("deleting {}", describe(o))))?
        {
            let _ = writeln!(out, "deleted {}", describe(o));
        }
    }
    for g in gaps(served) {
        let _ = writeln!(out, "note: {g}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `handoff serve`: keep the parameter current.

/// Publish `dir` if the parameter ConfigMap exists (the policy is installed) and says
/// something else. Every replica may do this: they write the same content with the same field
/// manager. Returns whether it wrote.
pub async fn publish(
    client: &kube::Client,
    params: &ParamsRef,
    data: &BTreeMap<String, String>,
) -> Result<bool, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &params.namespace);
    let Some(current) = api.get_opt(&params.name).await? else {
        return Ok(false);
    };
    if current.data.as_ref().unwrap_or(&BTreeMap::new()) == data {
        return Ok(false);
    }
    apply(client, &params_object(params, data)).await?;
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// `handoff window open | close`.

/// Whether the pin's policies are installed (and the API serves them): only then does a
/// window get bindings.
pub async fn pin_installed(client: &kube::Client) -> Result<bool, kube::Error> {
    // An API server that does not serve the kind answers 404 as for a missing object.
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("MutatingAdmissionPolicy"));
    Ok(api.get_opt(PIN_POLICY).await?.is_some())
}

pub async fn bind_window(
    client: &kube::Client,
    window: &str,
    selector: &LabelSelector,
) -> Result<(), kube::Error> {
    let uid = Api::<MoveWindow>::all(client.clone())
        .get_opt(window)
        .await?
        .and_then(|w| w.metadata.uid);
    for b in window_bindings(window, uid.as_deref(), selector) {
        apply(client, &b).await?;
    }
    Ok(())
}

/// Remove a window's bindings; `true` when any was there.
pub async fn unbind_window(client: &kube::Client, window: &str) -> Result<bool, kube::Error> {
    // Where the kind is not served, the deletes answer 404 like missing bindings.
    let mut any = false;
    for scale in [false, true] {
        let o = serde_json::json!({"kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": binding_name(window, scale)}});
        any |= delete(client, &o).await?;
    }
    Ok(any)
}

/// A short summary for `policy show` on stderr.
pub fn summary(objects: &[Value]) -> String {
    let mut s = String::new();
    for o in objects {
        let _ = writeln!(s, "  {}", describe(o));
    }
    s
}

/// `handoff serve`: keep the guard policy's parameter equal to what this replica can compute,
/// while the policy is installed. Waits for the namespace cache: a partial view would drop
/// identities the policy still needs.
pub async fn keep_published(
    client: kube::Client,
    state: Arc<crate::state::State>,
    params: ParamsRef,
    interval: std::time::Duration,
) {
    let mut last_error: Option<String> = None;
    loop {
        if state.namespaces.is_synced() && state.namespaces_stale().is_none() {
            let dir = directory(&state.ids, &state.ids.located_targets());
            let published = publish(&client, &params, &dir.data).await;
            let t = &state.telemetry;
            match &published {
                Ok(_) => {
                    t.policy_publishes
                        .get_or_create(&crate::state::telemetry::OK)
                        .inc();
                    t.policy_last_published
                        .set(crate::state::telemetry::unix_now());
                }
                Err(_) => {
                    t.policy_publishes
                        .get_or_create(&crate::state::telemetry::ERROR)
                        .inc();
                }
            }
            match published {
                Ok(true) => {
                    tracing::info!(
                        configmap = %params,
                        identities = dir.data.len(),
                        skipped = ?dir.skipped,
                        unpublishable = ?dir.unpublishable,
                        "published sync-target identities for the admission policy"
                    );
                    last_error = None;
                }
                Ok(false) => last_error = None,
                Err(e) => {
                    let e = e.to_string();
                    if last_error.as_deref() != Some(&e) {
                        tracing::warn!(configmap = %params, error = %e, "cannot publish sync-target identities for the admission policy; it keeps the last published ones");
                    }
                    last_error = Some(e);
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}
