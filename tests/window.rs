//! `handoff window` against real kube-apiservers (the source and the target of a move), each
//! behind the fault proxy (`tests/support/fault_proxy.rs`) through which the commands reach it:
//! its log orders and counts their writes, and it refuses writes after the N-th on cue (a run
//! killed after any step). Seeding and reading back go straight to the API server, out of that
//! log. envtest runs no controller-manager: a loop here stands in for the Deployment controller.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use handoff::resources::move_window::MoveRole;
use handoff::rules::move_window::OwnDeployment;
use handoff::window::progress::Progress;
use handoff::window::{self as ops, CloseOptions, Cluster, OpenOptions, WindowError};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};
use support::apiserver::{ADMIN, ApiServer, Handoff, skip};
use support::fault_proxy::{AfterAnswer, FaultProxy};

const SAVED: &str = "handoff.dev/replicas-before-move";
const NAMESPACES: [&str; 5] = [
    "capi-system",
    "capi-kubeadm-bootstrap-system",
    "cert-manager",
    "handoff-system",
    "web",
];

fn deployment(ns: &str, name: &str, replicas: i64, labels: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "manager", "image": "x"}]}}
        }
    })
}

fn capi(provider: &str) -> Value {
    json!({"cluster.x-k8s.io/provider": provider, "clusterctl.cluster.x-k8s.io": ""})
}

/// One cluster: a real API server, the proxy the commands go through, the admin's client
/// straight to the server, and (where a test needs the pin in the API server) `handoff serve`
/// registered as its mutating webhook.
struct Env {
    api: ApiServer,
    proxy: FaultProxy,
    admin: kube::Client,
    _handoff: Option<Handoff>,
    /// Held by the Deployment controller's stand-in for each pass, and by `reset`.
    controller_lock: Arc<tokio::sync::Mutex<()>>,
    controller: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(c) = self.controller.take() {
            c.abort();
        }
    }
}

/// A new cluster with the MoveWindow CRD; with `pin`, handoff registered with the project's
/// `local` overlay (the CRD and both webhook configurations), serving as the admin.
async fn env(pin: bool) -> Env {
    let (api, proxy, handoff) = tokio::task::spawn_blocking(move || {
        let api = ApiServer::start();
        let handoff = pin.then(|| {
            let h = Handoff::start(&api, ADMIN, &[]);
            h.register(&api);
            h
        });
        api.install_crd();
        let handoff = handoff.map(|mut h| {
            h.wait_ready();
            h
        });
        let proxy = FaultProxy::start(&api);
        (api, proxy, handoff)
    })
    .await
    .expect("cluster start");
    let admin = api.client().await;
    Env {
        api,
        proxy,
        admin,
        _handoff: handoff,
        controller_lock: Arc::new(tokio::sync::Mutex::new(())),
        controller: None,
    }
}

/// The API resource of `api_version`/`kind` and whether it is namespaced.
fn resource(api_version: &str, kind: &str) -> (ApiResource, bool) {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (plural, namespaced) = match kind {
        "Namespace" => ("namespaces", false),
        "Pod" => ("pods", true),
        "Service" => ("services", true),
        "Deployment" => ("deployments", true),
        "ValidatingWebhookConfiguration" => ("validatingwebhookconfigurations", false),
        "MutatingWebhookConfiguration" => ("mutatingwebhookconfigurations", false),
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "MoveWindow" => ("movewindows", false),
        "MutatingAdmissionPolicyBinding" => ("mutatingadmissionpolicybindings", false),
        other => panic!("no plural for {other}"),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    (ApiResource::from_gvk_with_plural(&gvk, plural), namespaced)
}

fn dynamic(
    admin: &kube::Client,
    api_version: &str,
    kind: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let (ar, namespaced) = resource(api_version, kind);
    match (namespaced, ns) {
        (true, Some(ns)) => Api::namespaced_with(admin.clone(), ns, &ar),
        _ => Api::all_with(admin.clone(), &ar),
    }
}

/// Create or update `obj` as the admin (server-side apply), straight to the API server.
async fn put(admin: &kube::Client, obj: Value) {
    let api = dynamic(
        admin,
        obj["apiVersion"].as_str().expect("apiVersion"),
        obj["kind"].as_str().expect("kind"),
        obj["metadata"]["namespace"].as_str(),
    );
    let name = obj["metadata"]["name"].as_str().expect("name");
    api.patch(
        name,
        &PatchParams::apply("window-test").force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {obj}: {e}"));
}

async fn get(
    admin: &kube::Client,
    api_version: &str,
    kind: &str,
    ns: Option<&str>,
    name: &str,
) -> Option<Value> {
    dynamic(admin, api_version, kind, ns)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading {kind} {name}: {e}"))
        .map(|o| serde_json::to_value(o).expect("json"))
}

/// Every object of a kind, across namespaces, in the API server's order (namespace, name).
async fn list(admin: &kube::Client, api_version: &str, kind: &str) -> Vec<Value> {
    dynamic(admin, api_version, kind, None)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing {kind}: {e}"))
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("json"))
        .collect()
}

/// A management cluster: two provider controllers with their pods, cert-manager (never
/// selected), handoff itself (labelled like a provider, never pinned) and an unrelated app.
async fn seed(e: &Env) {
    for ns in NAMESPACES {
        put(
            &e.admin,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    seed_workloads(e).await;
}

async fn seed_workloads(e: &Env) {
    let deployments = [
        (
            "capi-system",
            "capi-controller-manager",
            3,
            capi("cluster-api"),
        ),
        (
            "capi-kubeadm-bootstrap-system",
            "capi-kubeadm-bootstrap-controller-manager",
            2,
            capi("bootstrap-kubeadm"),
        ),
        (
            "cert-manager",
            "cert-manager",
            1,
            json!({"cluster.x-k8s.io/provider": "cert-manager", "clusterctl.cluster.x-k8s.io": "", "clusterctl.cluster.x-k8s.io/core": "cert-manager"}),
        ),
        ("handoff-system", "handoff", 3, capi("handoff")),
        ("web", "frontend", 4, json!({"app": "frontend"})),
    ];
    for (ns, name, replicas, labels) in deployments {
        put(&e.admin, deployment(ns, name, replicas, labels)).await;
        for i in 0..replicas {
            put(&e.admin, json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{name}-{i}"), "namespace": ns, "labels": {"app": name}},
                "spec": {"containers": [{"name": "manager", "image": "x"}]}})).await;
        }
    }
}

/// Back to the seeded cluster: no window, every Deployment and pod as `seed` made them (deleted
/// and created again, so that nothing a run wrote survives).
async fn reset(e: &Env) {
    let _pause = e.controller_lock.lock().await;
    let windows = dynamic(&e.admin, "handoff.dev/v1alpha1", "MoveWindow", None);
    for w in list(&e.admin, "handoff.dev/v1alpha1", "MoveWindow").await {
        windows
            .delete(
                w["metadata"]["name"].as_str().unwrap(),
                &DeleteParams::default(),
            )
            .await
            .expect("delete window");
    }
    for ns in NAMESPACES {
        Api::<Deployment>::namespaced(e.admin.clone(), ns)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect("delete deployments");
        // Never scheduled: deleted at once.
        Api::<Pod>::namespaced(e.admin.clone(), ns)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect("delete pods");
    }
    seed_workloads(e).await;
}

/// Stands in for the Deployment controller (envtest has none): pods of a Deployment scaled to 0
/// go away.
fn run_deployment_controller(e: &mut Env) {
    let (admin, lock) = (e.admin.clone(), e.controller_lock.clone());
    e.controller = Some(tokio::spawn(async move {
        loop {
            {
                let _pass = lock.lock().await;
                let deployments = Api::<Deployment>::all(admin.clone())
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                for d in deployments {
                    let spec = d.spec.as_ref();
                    if spec.and_then(|s| s.replicas) != Some(0) {
                        continue;
                    }
                    let ns = d.metadata.namespace.clone().unwrap_or_default();
                    let Some(app) = spec
                        .and_then(|s| s.selector.match_labels.as_ref())
                        .and_then(|l| l.get("app"))
                    else {
                        continue;
                    };
                    let _ = Api::<Pod>::namespaced(admin.clone(), &ns)
                        .delete_collection(
                            &DeleteParams::default(),
                            &ListParams::default().labels(&format!("app={app}")),
                        )
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }));
}

/// Two seeded clusters, each with its Deployment controller; `pin_*`: handoff registered there.
async fn source_and_target(pin_source: bool, pin_target: bool) -> (Env, Env) {
    let (mut source, mut target) = tokio::join!(env(pin_source), env(pin_target));
    seed(&source).await;
    seed(&target).await;
    run_deployment_controller(&mut source);
    run_deployment_controller(&mut target);
    (source, target)
}

fn roles(source: &Env, target: &Env) -> [Cluster; 2] {
    [
        cluster(source, Some(MoveRole::Source)),
        cluster(target, Some(MoveRole::Target)),
    ]
}

fn cluster(e: &Env, role: Option<MoveRole>) -> Cluster {
    Cluster::new(e.proxy.client(), role)
}

fn own() -> OwnDeployment {
    OwnDeployment {
        namespace: "handoff-system".into(),
        name: "handoff".into(),
    }
}

fn open_opts() -> OpenOptions {
    OpenOptions {
        name: "capi-move".into(),
        selector: None,
        reason: Some("clusterctl move".into()),
        allow_webhook_outage: false,
        wait_timeout: Duration::from_secs(20),
        poll: Duration::from_millis(20),
        own: own(),
        stop: None,
        standby: true,
        quiet_preflight: false,
    }
}

fn close_opts() -> CloseOptions {
    CloseOptions {
        name: "capi-move".into(),
        restore_timeout: Duration::from_secs(10),
        poll: Duration::from_millis(20),
        settle: Duration::from_millis(100),
        lead_timeout: Duration::from_secs(5),
        wait_leading: true,
        uninstall: true,
    }
}

/// (replicas, saved annotation) of a Deployment.
async fn dep(e: &Env, ns: &str, name: &str) -> (i64, Option<String>) {
    let d = get(&e.admin, "apps/v1", "Deployment", Some(ns), name)
        .await
        .expect("deployment");
    (
        d["spec"]["replicas"].as_i64().unwrap_or(1),
        d["metadata"]["annotations"][SAVED]
            .as_str()
            .map(str::to_string),
    )
}

async fn window(e: &Env) -> Value {
    get(
        &e.admin,
        "handoff.dev/v1alpha1",
        "MoveWindow",
        None,
        "capi-move",
    )
    .await
    .expect("MoveWindow capi-move")
}

/// Everything the commands are responsible for, without what the API server sets on its own
/// (resourceVersion, uid, managedFields, timestamps, generation) or the commands' timestamps.
async fn snapshot(e: &Env) -> Value {
    let deployments: Vec<Value> = list(&e.admin, "apps/v1", "Deployment")
        .await
        .into_iter()
        .map(|d| {
            json!([
                d["metadata"]["namespace"],
                d["metadata"]["name"],
                d["spec"]["replicas"],
                d["metadata"]["annotations"][SAVED]
            ])
        })
        .collect();
    let windows: Vec<Value> = list(&e.admin, "handoff.dev/v1alpha1", "MoveWindow")
        .await
        .into_iter()
        .map(|w| {
            let pinned: Vec<Value> = w["status"]["pinned"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|p| json!([p["namespace"], p["name"], p["savedReplicas"], p["restoredAt"].is_string(), p["note"]]))
                .collect();
            json!({"name": w["metadata"]["name"], "spec": w["spec"], "phase": w["status"]["phase"],
                   "pinnedCount": w["status"]["pinnedCount"], "pinned": pinned, "lastStep": w["status"]["lastStep"]})
        })
        .collect();
    let pods = list(&e.admin, "v1", "Pod").await.len();
    json!({"deployments": deployments, "windows": windows, "pods": pods})
}

/// `kubectl apply` of `obj` as the admin, as a GitOps sync would: `(succeeded, stderr)`.
fn kubectl_apply(e: &Env, obj: &Value) -> (bool, String) {
    let out = e
        .api
        .kubectl_stdin(ADMIN, &["apply", "-f", "-"], Some(&obj.to_string()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Wait until handoff's watches have seen the window open: a server-side dry run of `obj`
/// comes back pinned by the API server's call to handoff.
async fn until_pinned_by_the_api_server(e: &Env, obj: &Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = e.api.kubectl_stdin(
            ADMIN,
            &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&obj.to_string()),
        );
        let stored: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if stored["spec"]["replicas"] == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a dry run is still not pinned after 30 s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn open_pins_saves_waits_and_a_later_update_is_pinned() {
    if skip() {
        return;
    }
    // The source has handoff registered: a later update is pinned by the API server itself.
    let (source, target) = source_and_target(true, false).await;
    let clusters = roles(&source, &target);
    let (mut out, said) = Progress::captured();
    ops::open(&clusters, &open_opts(), &mut out).await.unwrap();
    let log = said.text();

    for e in [&source, &target] {
        assert_eq!(
            dep(e, "capi-system", "capi-controller-manager").await,
            (0, Some("3".into()))
        );
        assert_eq!(
            dep(
                e,
                "capi-kubeadm-bootstrap-system",
                "capi-kubeadm-bootstrap-controller-manager"
            )
            .await,
            (0, Some("2".into()))
        );
        // Not selected, or handoff itself: untouched.
        assert_eq!(dep(e, "cert-manager", "cert-manager").await, (1, None));
        assert_eq!(dep(e, "handoff-system", "handoff").await, (3, None));
        assert_eq!(dep(e, "web", "frontend").await, (4, None));
        let pods = list(&e.admin, "v1", "Pod").await;
        assert!(
            pods.iter()
                .all(|p| p["metadata"]["namespace"] != "capi-system"),
            "pods gone"
        );
        assert_eq!(pods.len(), 8, "the pods of what was not pinned stay");
        let w = window(e).await;
        assert_eq!(w["spec"]["state"], "Open");
        assert_eq!(w["status"]["phase"], "Open");
        assert_eq!(w["status"]["pinnedCount"], 2);
        assert!(w["status"]["podsGoneAt"].is_string());
    }
    assert_eq!(window(&source).await["spec"]["role"], "source");
    assert_eq!(window(&target).await["spec"]["role"], "target");
    assert!(
        log.contains("source: pinned capi-system/capi-controller-manager to 0 replicas (was 3)"),
        "{log}"
    );

    // Open again: nothing changes, nothing is written to Deployments.
    let before = snapshot(&source).await;
    let writes = source.proxy.writes().len();
    ops::open(&clusters, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    assert_eq!(snapshot(&source).await, before);
    let new: Vec<String> = source.proxy.writes()[writes..].to_vec();
    assert!(!new.is_empty(), "the proxy logs the re-run's writes");
    assert!(new.iter().all(|w| !w.contains("/deployments/")), "{new:?}");

    // A GitOps sync asks for 5: the API server calls handoff, whose watches saw the window
    // open, and stores the Deployment pinned, the asked-for count saved, with the warning.
    let mut asked = deployment(
        "capi-system",
        "capi-controller-manager",
        5,
        capi("cluster-api"),
    );
    asked["spec"]["template"]["spec"]["containers"][0]["image"] = "x:v2".into();
    until_pinned_by_the_api_server(&source, &asked).await;
    let (ok, stderr) = kubectl_apply(&source, &asked);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("MoveWindow \"capi-move\""),
        "no pin warning: {stderr}"
    );
    assert_eq!(
        dep(&source, "capi-system", "capi-controller-manager").await,
        (0, Some("5".into()))
    );
    // An app is not the window's: the same apply goes through as asked.
    let (ok, stderr) = kubectl_apply(
        &source,
        &deployment("web", "frontend", 5, json!({"app": "frontend"})),
    );
    assert!(ok, "{stderr}");
    assert_eq!(dep(&source, "web", "frontend").await, (5, None));
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn close_restores_target_before_source() {
    if skip() {
        return;
    }
    // The target has handoff registered: the sync below is pinned by the API server.
    let (source, target) = source_and_target(false, true).await;
    let clusters = roles(&source, &target);
    ops::open(&clusters, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    // While the window is open a GitOps sync asks for 5 on the target: the webhook saves it.
    let asked = deployment(
        "capi-system",
        "capi-controller-manager",
        5,
        capi("cluster-api"),
    );
    until_pinned_by_the_api_server(&target, &asked).await;
    let (ok, stderr) = kubectl_apply(&target, &asked);
    assert!(ok, "{stderr}");
    assert_eq!(
        dep(&target, "capi-system", "capi-controller-manager").await,
        (0, Some("5".into()))
    );

    let mark = source.proxy.sequenced_writes().len();
    let tmark = target.proxy.sequenced_writes().len();
    let ordered = [clusters[1].clone(), clusters[0].clone()];
    let restored = ops::close(&ordered, &close_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    assert_eq!(restored.len(), 4);
    assert_eq!(
        dep(&target, "capi-system", "capi-controller-manager").await,
        (5, None)
    );
    assert_eq!(
        dep(&source, "capi-system", "capi-controller-manager").await,
        (3, None)
    );
    for e in [&source, &target] {
        assert_eq!(
            dep(
                e,
                "capi-kubeadm-bootstrap-system",
                "capi-kubeadm-bootstrap-controller-manager"
            )
            .await,
            (2, None)
        );
        let w = window(e).await;
        assert_eq!(w["spec"]["state"], "Closed");
        assert_eq!(w["status"]["phase"], "Closed");
    }
    let t_writes = &target.proxy.sequenced_writes()[tmark..];
    let s_writes = &source.proxy.sequenced_writes()[mark..];
    let last_target = t_writes
        .iter()
        .filter(|(_, w)| w.contains("/deployments/"))
        .map(|(s, _)| *s)
        .max()
        .unwrap();
    let first_source = s_writes.iter().map(|(s, _)| *s).min().unwrap();
    assert!(
        last_target < first_source,
        "target restored before source touched: {t_writes:?} {s_writes:?}"
    );
    // On each cluster the window is closed before any Deployment is restored.
    let first_window = t_writes
        .iter()
        .find(|(_, w)| w.contains("movewindows"))
        .unwrap();
    assert!(
        first_window.1.starts_with("PATCH") && first_window.1.contains("/movewindows/capi-move"),
        "{t_writes:?}"
    );
    let first_dep = t_writes
        .iter()
        .find(|(_, w)| w.contains("/deployments/"))
        .unwrap();
    assert!(first_window.0 < first_dep.0, "{t_writes:?}");
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn missing_or_unreadable_annotations_are_reported_and_fall_back() {
    if skip() {
        return;
    }
    let mut e = env(false).await;
    seed(&e).await;
    run_deployment_controller(&mut e);
    let clusters = [cluster(&e, None)];
    ops::open(&clusters, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    // Someone took the pin the window brought away (nothing of handoff is installed here)
    // and wrote garbage into one annotation.
    for b in [
        "handoff-window-capi-move-pin",
        "handoff-window-capi-move-pin-scale",
    ] {
        dynamic(
            &e.admin,
            "admissionregistration.k8s.io/v1",
            "MutatingAdmissionPolicyBinding",
            None,
        )
        .delete(b, &DeleteParams::default())
        .await
        .expect("delete the window's pin binding");
    }
    wait_unpinned(&e, "capi-system", "capi-controller-manager").await;
    Api::<Deployment>::namespaced(e.admin.clone(), "capi-system")
        .patch(
            "capi-controller-manager",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SAVED: "three"}}})),
        )
        .await
        .unwrap();
    // A Deployment pinned by hand, with no record and no annotation, that the window selects.
    let mut d = deployment("capi-system", "capi-extra", 0, capi("extra"));
    d["metadata"]["annotations"] = json!({SAVED: ""});
    put(&e.admin, d).await;
    let (mut out, said) = Progress::captured();
    let restored = ops::close(&clusters, &close_opts(), &mut out)
        .await
        .unwrap();
    let log = said.text();
    assert_eq!(
        dep(&e, "capi-system", "capi-controller-manager").await,
        (1, None)
    );
    assert_eq!(dep(&e, "capi-system", "capi-extra").await, (1, None));
    assert!(
        log.contains("\"three\" is unreadable; restored to 1"),
        "{log}"
    );
    let notes: Vec<_> = restored.iter().filter(|r| r.note.is_some()).collect();
    assert_eq!(notes.len(), 2, "{restored:?}");
    let w = window(&e).await;
    let pinned = w["status"]["pinned"].as_array().unwrap();
    assert!(
        pinned
            .iter()
            .any(|p| p["note"].as_str().is_some_and(|n| n.contains("unreadable")))
    );
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn preflight_refuses_a_deployment_that_serves_a_fail_closed_webhook() {
    if skip() {
        return;
    }
    let mut e = env(false).await;
    seed(&e).await;
    put(
        &e.admin,
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "capi-webhook-service", "namespace": "capi-system"},
        "spec": {"selector": {"app": "capi-controller-manager"}, "ports": [{"port": 443}]}}),
    )
    .await;
    // No rules: the API server never calls them, the preflight still reads them.
    put(&e.admin, json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "capi-validating-webhook-configuration"},
        "webhooks": [{"name": "validation.cluster.cluster.x-k8s.io", "failurePolicy": "Fail",
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "capi-webhook-service", "namespace": "capi-system", "path": "/validate"}}},
            {"name": "ignored.cluster.x-k8s.io", "failurePolicy": "Ignore",
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "capi-webhook-service", "namespace": "capi-system"}}}]})).await;
    put(&e.admin, json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusters.cluster.x-k8s.io"},
        "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
            "names": {"plural": "clusters", "singular": "cluster", "kind": "Cluster", "listKind": "ClusterList"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "capi-webhook-service", "namespace": "capi-system"}}}}}})).await;
    let clusters = [cluster(&e, None)];
    let writes = e.proxy.writes().len();
    let err = ops::open(&clusters, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap_err();
    let WindowError::Preflight(findings) = &err else {
        panic!("{err}")
    };
    assert_eq!(findings.len(), 2, "{findings:?}");
    let msg = err.to_string();
    assert!(msg.contains("Deployment capi-system/capi-controller-manager backs Service capi-system/capi-webhook-service"), "{msg}");
    assert!(
        msg.contains("validation.cluster.cluster.x-k8s.io")
            && msg.contains("clusters.cluster.x-k8s.io conversion"),
        "{msg}"
    );
    assert!(!msg.contains("ignored.cluster"), "{msg}");
    assert!(msg.contains("--allow-webhook-outage"));
    assert!(
        !e.proxy.requests().is_empty(),
        "the preflight read through the proxy"
    );
    assert_eq!(
        e.proxy.writes().len(),
        writes,
        "nothing written when preflight refuses"
    );

    run_deployment_controller(&mut e);
    let opts = OpenOptions {
        allow_webhook_outage: true,
        ..open_opts()
    };
    let (mut out, said) = Progress::captured();
    ops::open(&clusters, &opts, &mut out).await.unwrap();
    assert!(said.text().contains("allowed by --allow-webhook-outage"));
    assert_eq!(
        dep(&e, "capi-system", "capi-controller-manager").await,
        (0, Some("3".into()))
    );
}

/// Kill `open` (then `close`) after each of its writes, run it again, and compare with a run
/// that was never interrupted. One API server, reset to the seeded state before every run.
#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn a_run_killed_after_any_step_and_rerun_ends_in_the_same_state() {
    if skip() {
        return;
    }
    let mut e = env(false).await;
    seed(&e).await;
    run_deployment_controller(&mut e);
    let cl = [cluster(&e, None)];
    ops::open(&cl, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    let opened = snapshot(&e).await;
    let open_writes = e.proxy.writes().len();
    ops::close(&cl, &close_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    let closed = snapshot(&e).await;
    let close_writes = e.proxy.writes().len() - open_writes;
    assert!(
        open_writes >= 6 && close_writes >= 6,
        "{open_writes} {close_writes}"
    );
    assert_ne!(opened, closed);

    for n in 0..open_writes as u64 {
        reset(&e).await;
        e.proxy.fail_writes_after(Some(n));
        let first = ops::open(&cl, &open_opts(), &mut Progress::quiet()).await;
        assert!(first.is_err(), "open should die after {n} writes");
        e.proxy.fail_writes_after(None);
        ops::open(&cl, &open_opts(), &mut Progress::quiet())
            .await
            .unwrap();
        assert_eq!(
            snapshot(&e).await,
            opened,
            "open killed after {n} writes, then re-run"
        );
    }
    for n in 0..close_writes as u64 {
        reset(&e).await;
        ops::open(&cl, &open_opts(), &mut Progress::quiet())
            .await
            .unwrap();
        e.proxy.fail_writes_after(Some(n));
        let first = ops::close(&cl, &close_opts(), &mut Progress::quiet()).await;
        assert!(first.is_err(), "close should die after {n} writes");
        e.proxy.fail_writes_after(None);
        ops::close(&cl, &close_opts(), &mut Progress::quiet())
            .await
            .unwrap();
        assert_eq!(
            snapshot(&e).await,
            closed,
            "close killed after {n} writes, then re-run"
        );
    }
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn status_shows_windows_deployments_and_saved_counts() {
    if skip() {
        return;
    }
    let mut e = env(false).await;
    seed(&e).await;
    run_deployment_controller(&mut e);
    let clusters = [cluster(&e, None)];
    ops::open(&clusters, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    let views = ops::status(&clusters, None, &own()).await.unwrap();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].deployments.len(), 2);
    let table = ops::render_table(&views);
    assert!(
        table.contains("capi-move") && table.contains("Open"),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.contains("capi-system/capi-controller-manager"))
        .unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cols[1..5], &["Scale", "0", "3", "3"], "{line}");
    let json = serde_json::to_value(&views).unwrap();
    assert_eq!(json[0]["deployments"][1]["name"], "capi-controller-manager");
    assert_eq!(json[0]["deployments"][1]["recorded"], 3);
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn a_target_that_fails_leaves_no_controller_stopped_and_close_finishes_the_rest() {
    if skip() {
        return;
    }
    let (mut source, target) = tokio::join!(env(false), env(false));
    seed(&source).await;
    seed(&target).await;
    run_deployment_controller(&mut source);
    let clusters = roles(&source, &target);
    // The target accepts reads but no writes: its window cannot be created.
    target.proxy.fail_writes_after(Some(0));
    assert!(
        ops::open(&clusters, &open_opts(), &mut Progress::quiet())
            .await
            .is_err()
    );
    assert!(
        target
            .proxy
            .writes()
            .iter()
            .any(|w| w.starts_with("POST ") && w.contains("/movewindows")),
        "the target's window create was tried (and refused): {:?}",
        target.proxy.writes()
    );
    // Nothing was pinned anywhere: every window is created before any Deployment is touched.
    assert_eq!(
        dep(&source, "capi-system", "capi-controller-manager").await,
        (3, None)
    );
    assert_eq!(
        dep(&target, "capi-system", "capi-controller-manager").await,
        (3, None)
    );
    assert!(
        get(
            &target.admin,
            "handoff.dev/v1alpha1",
            "MoveWindow",
            None,
            "capi-move"
        )
        .await
        .is_none()
    );
    // Closing with both clusters finishes on the source although the target has no window.
    target.proxy.fail_writes_after(None);
    let (mut out, said) = Progress::captured();
    ops::close(
        &[clusters[1].clone(), clusters[0].clone()],
        &close_opts(),
        &mut out,
    )
    .await
    .unwrap();
    let log = said.text();
    assert!(
        log.contains("target: there is no MoveWindow capi-move"),
        "{log}"
    );
    assert_eq!(window(&source).await["spec"]["state"], "Closed");
    // A name that exists nowhere is an error.
    let err = ops::close(
        &clusters,
        &CloseOptions {
            name: "nope".into(),
            ..close_opts()
        },
        &mut Progress::quiet(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("there is no MoveWindow nope"),
        "{err}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn preflight_checks_the_selector_of_an_existing_window() {
    if skip() {
        return;
    }
    let e = env(false).await;
    seed(&e).await;
    // A window created by hand that selects the web frontend, which serves a fail-closed webhook.
    put(&e.admin, json!({"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow", "metadata": {"name": "capi-move"},
        "spec": {"state": "Closed", "deploymentSelector": {"matchLabels": {"app": "frontend"}}}})).await;
    put(
        &e.admin,
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "frontend", "namespace": "web"},
        "spec": {"selector": {"app": "frontend"}, "ports": [{"port": 443}]}}),
    )
    .await;
    // No rules: the API server never calls it, the preflight still reads it.
    put(&e.admin, json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "web"},
        "webhooks": [{"name": "web.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "frontend", "namespace": "web"}}}]})).await;
    let err = ops::open(&[cluster(&e, None)], &open_opts(), &mut Progress::quiet())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Deployment web/frontend backs Service web/frontend"),
        "{err}"
    );
    assert_eq!(dep(&e, "web", "frontend").await, (4, None));
}

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn a_restore_pinned_again_by_a_stale_replica_is_retried() {
    if skip() {
        return;
    }
    let mut e = env(false).await;
    seed(&e).await;
    run_deployment_controller(&mut e);
    let clusters = [cluster(&e, None)];
    ops::open(&clusters, &open_opts(), &mut Progress::quiet())
        .await
        .unwrap();
    let mark = e.proxy.writes().len();
    // A handoff replica whose cache lags behind the close pins the Deployment again each time
    // the close has just read it restored, twice, then catches up. Each pin lands after the
    // close's read and before its next look (the proxy holds the answer until it is written),
    // however fast or slow the machine. Its writes go straight to the API server (the proxy's
    // own client), out of the proxy's log.
    const STALE_PINS: u32 = 2;
    let repinned = Arc::new(AtomicU32::new(0));
    let pins = repinned.clone();
    let stale_replica: AfterAnswer = Arc::new(move |_, client| {
        let pins = pins.clone();
        Box::pin(async move {
            if pins.load(Ordering::SeqCst) >= STALE_PINS {
                return;
            }
            let api = Api::<Deployment>::namespaced(client, "capi-system");
            let mut d = api
                .get("capi-controller-manager")
                .await
                .expect("the stale replica's read");
            let spec = d.spec.as_mut().expect("spec");
            let Some(asked) = spec.replicas.filter(|r| *r != 0) else {
                return;
            };
            spec.replicas = Some(0);
            d.metadata
                .annotations
                .get_or_insert_default()
                .insert(SAVED.into(), asked.to_string());
            // Guarded by the resourceVersion read; the close waits for this answer meanwhile.
            api.replace("capi-controller-manager", &PostParams::default(), &d)
                .await
                .expect("the stale replica's pin");
            pins.fetch_add(1, Ordering::SeqCst);
        })
    });
    e.proxy.after_answer(Some((
        "GET /apis/apps/v1/namespaces/capi-system/deployments/capi-controller-manager",
        stale_replica,
    )));
    let (mut out, said) = Progress::captured();
    let closed = ops::close(&clusters, &close_opts(), &mut out).await;
    e.proxy.after_answer(None);
    let log = said.text();
    closed.unwrap_or_else(|err| panic!("{err}\n{log}"));
    let repinned = repinned.load(Ordering::SeqCst);
    assert_eq!(
        repinned, STALE_PINS,
        "the stale replica pinned {repinned} times:\n{log}"
    );
    assert_eq!(
        log.matches("capi-system/capi-controller-manager was pinned again; restoring again")
            .count(),
        STALE_PINS as usize,
        "{log}"
    );
    assert_eq!(
        dep(&e, "capi-system", "capi-controller-manager").await,
        (3, None)
    );
    // Every pin again came after a restore, and a restore came after the last one.
    let restores = e.proxy.writes()[mark..]
        .iter()
        .filter(|w| {
            w.starts_with("PATCH ")
                && w.contains("/namespaces/capi-system/deployments/capi-controller-manager")
        })
        .count();
    assert_eq!(
        restores,
        repinned as usize + 1,
        "close restored {restores} times, the stale replica pinned {repinned} times"
    );
}

/// Until the API server no longer pins the Deployment (its policy cache follows a binding's
/// delete by a moment): a server-side dry run asking for 1 replica keeps it.
async fn wait_unpinned(e: &Env, ns: &str, name: &str) {
    let api = Api::<Deployment>::namespaced(e.admin.clone(), ns);
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    for _ in 0..600 {
        let d = api
            .patch(name, &dry, &Patch::Merge(json!({"spec": {"replicas": 1}})))
            .await
            .expect("dry run");
        if d.spec.and_then(|s| s.replicas) == Some(1) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{ns}/{name} still pinned a minute after its binding was deleted");
}
