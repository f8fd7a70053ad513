//! `handoff window` against two in-process API servers (source and target of a move).

mod support;

use std::sync::Arc;
use std::time::Duration;

use handoff::resources::move_window::MoveRole;
use handoff::rules::move_window::OwnDeployment;
use handoff::window::{self as ops, CloseOptions, Cluster, OpenOptions, WindowError};
use serde_json::{Value, json};
use support::fake_api::FakeApi;

const SAVED: &str = "handoff.dev/replicas-before-move";

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

/// A management cluster: two provider controllers with running pods, cert-manager (never
/// selected), handoff itself (labelled like a provider, never pinned) and an unrelated app.
fn seed(fake: &FakeApi) {
    for ns in [
        "capi-system",
        "capi-kubeadm-bootstrap-system",
        "cert-manager",
        "handoff-system",
        "web",
    ] {
        fake.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
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
        fake.put(deployment(ns, name, replicas, labels));
        for i in 0..replicas {
            fake.put(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{name}-{i}"), "namespace": ns, "labels": {"app": name}}}));
        }
    }
}

/// Stands in for the Deployment controller: pods of a Deployment scaled to 0 go away.
fn run_deployment_controller(fake: Arc<FakeApi>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for d in fake.list("apps/v1", "Deployment") {
                if d["spec"]["replicas"] != 0 {
                    continue;
                }
                let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
                let app = &d["spec"]["template"]["metadata"]["labels"]["app"];
                for p in fake.list("v1", "Pod") {
                    if p["metadata"]["namespace"] == ns && &p["metadata"]["labels"]["app"] == app {
                        fake.remove(
                            "v1",
                            "Pod",
                            Some(ns),
                            p["metadata"]["name"].as_str().unwrap(),
                        );
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

fn cluster(fake: &FakeApi, label: &str, role: Option<MoveRole>) -> Cluster {
    Cluster {
        label: label.into(),
        client: fake.client(),
        role,
    }
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
        wait_timeout: Duration::from_secs(10),
        poll: Duration::from_millis(20),
        own: own(),
        stop: None,
    }
}

fn close_opts() -> CloseOptions {
    CloseOptions {
        name: "capi-move".into(),
        restore_timeout: Duration::from_secs(5),
        poll: Duration::from_millis(20),
        settle: Duration::from_millis(100),
        lead_timeout: Duration::from_secs(5),
    }
}

/// (replicas, saved annotation) of a Deployment.
fn dep(fake: &FakeApi, ns: &str, name: &str) -> (i64, Option<String>) {
    let d = fake
        .get("apps/v1", "Deployment", Some(ns), name)
        .expect("deployment");
    (
        d["spec"]["replicas"].as_i64().unwrap_or(1),
        d["metadata"]["annotations"][SAVED]
            .as_str()
            .map(str::to_string),
    )
}

/// Everything the commands are responsible for, without timestamps.
fn snapshot(fake: &FakeApi) -> Value {
    let deployments: Vec<Value> = fake
        .list("apps/v1", "Deployment")
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
    let windows: Vec<Value> = fake
        .list("handoff.dev/v1alpha1", "MoveWindow")
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
    let pods = fake.list("v1", "Pod").len();
    json!({"deployments": deployments, "windows": windows, "pods": pods})
}

#[tokio::test]
async fn open_pins_saves_waits_and_a_later_update_is_pinned() {
    let source = Arc::new(FakeApi::start().await);
    let target = Arc::new(FakeApi::start().await);
    seed(&source);
    seed(&target);
    let _c1 = run_deployment_controller(source.clone());
    let _c2 = run_deployment_controller(target.clone());
    let clusters = [
        cluster(&source, "source", Some(MoveRole::Source)),
        cluster(&target, "target", Some(MoveRole::Target)),
    ];
    let mut out = Vec::new();
    ops::open(&clusters, &open_opts(), &mut out).await.unwrap();
    let log = String::from_utf8(out).unwrap();

    for fake in [&source, &target] {
        assert_eq!(
            dep(fake, "capi-system", "capi-controller-manager"),
            (0, Some("3".into()))
        );
        assert_eq!(
            dep(
                fake,
                "capi-kubeadm-bootstrap-system",
                "capi-kubeadm-bootstrap-controller-manager"
            ),
            (0, Some("2".into()))
        );
        // Not selected, or handoff itself: untouched.
        assert_eq!(dep(fake, "cert-manager", "cert-manager"), (1, None));
        assert_eq!(dep(fake, "handoff-system", "handoff"), (3, None));
        assert_eq!(dep(fake, "web", "frontend"), (4, None));
        let pods: Vec<Value> = fake.list("v1", "Pod");
        assert!(
            pods.iter()
                .all(|p| p["metadata"]["namespace"] != "capi-system"),
            "pods gone"
        );
        let w = fake
            .get("handoff.dev/v1alpha1", "MoveWindow", None, "capi-move")
            .unwrap();
        assert_eq!(w["spec"]["state"], "Open");
        assert_eq!(w["status"]["phase"], "Open");
        assert_eq!(w["status"]["pinnedCount"], 2);
        assert!(w["status"]["podsGoneAt"].is_string());
    }
    let roles: Vec<Value> = [&source, &target]
        .iter()
        .map(|f| {
            f.get("handoff.dev/v1alpha1", "MoveWindow", None, "capi-move")
                .unwrap()["spec"]["role"]
                .clone()
        })
        .collect();
    assert_eq!(roles, vec![json!("source"), json!("target")]);
    assert!(
        log.contains("source: pinned capi-system/capi-controller-manager to 0 replicas (was 3)"),
        "{log}"
    );

    // The webhook, fed by watches of the source cluster, pins a later update.
    let mut state = handoff::state::State::new(Default::default());
    state.client = Some(source.client());
    let state = Arc::new(state);
    handoff::state::cluster::spawn_watches(source.client(), state.clone());
    for _ in 0..500 {
        if state.is_synced() && !state.windows.open().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let server = support::https::TestServer::start_with(state, Default::default()).await;
    let mut client = server.connect(support::https::Proto::H1).await;
    let reply = client
        .review(
            "/mutate/move-window",
            support::https::fixture("apply-deployment-client-side.json"),
        )
        .await;
    let r = &reply.json()["response"];
    assert_eq!(r["patchType"], "JSONPatch", "{r}");
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("MoveWindow \"capi-move\"")
    );
    server.stop().await;

    // Open again: nothing changes, nothing is written to Deployments.
    let before = snapshot(&source);
    let writes = source.writes().len();
    ops::open(&clusters, &open_opts(), &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(snapshot(&source), before);
    let new: Vec<String> = source.writes()[writes..].to_vec();
    assert!(new.iter().all(|w| !w.contains("/deployments/")), "{new:?}");
}

#[tokio::test]
async fn close_restores_target_before_source() {
    let source = Arc::new(FakeApi::start().await);
    let target = Arc::new(FakeApi::start().await);
    seed(&source);
    seed(&target);
    let _c1 = run_deployment_controller(source.clone());
    let _c2 = run_deployment_controller(target.clone());
    let clusters = [
        cluster(&source, "source", Some(MoveRole::Source)),
        cluster(&target, "target", Some(MoveRole::Target)),
    ];
    ops::open(&clusters, &open_opts(), &mut Vec::new())
        .await
        .unwrap();
    // While the window is open a GitOps sync asked for 5 on the target: the webhook saved it.
    let mut d = target
        .get(
            "apps/v1",
            "Deployment",
            Some("capi-system"),
            "capi-controller-manager",
        )
        .unwrap();
    d["metadata"]["annotations"][SAVED] = "5".into();
    target.put(d);

    let mark = source.sequenced_writes().len();
    let tmark = target.sequenced_writes().len();
    let ordered = [clusters[1].clone(), clusters[0].clone()];
    let restored = ops::close(&ordered, &close_opts(), &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(restored.len(), 4);
    assert_eq!(
        dep(&target, "capi-system", "capi-controller-manager"),
        (5, None)
    );
    assert_eq!(
        dep(&source, "capi-system", "capi-controller-manager"),
        (3, None)
    );
    for fake in [&source, &target] {
        assert_eq!(
            dep(
                fake,
                "capi-kubeadm-bootstrap-system",
                "capi-kubeadm-bootstrap-controller-manager"
            ),
            (2, None)
        );
        let w = fake
            .get("handoff.dev/v1alpha1", "MoveWindow", None, "capi-move")
            .unwrap();
        assert_eq!(w["spec"]["state"], "Closed");
        assert_eq!(w["status"]["phase"], "Closed");
    }
    let t_writes = &target.sequenced_writes()[tmark..];
    let s_writes = &source.sequenced_writes()[mark..];
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
        first_window.1.starts_with("PATCH") && first_window.1.contains("/movewindows/capi-move")
    );
    let first_dep = t_writes
        .iter()
        .find(|(_, w)| w.contains("/deployments/"))
        .unwrap();
    assert!(first_window.0 < first_dep.0);
}

#[tokio::test]
async fn missing_or_unreadable_annotations_are_reported_and_fall_back() {
    let fake = Arc::new(FakeApi::start().await);
    seed(&fake);
    let _c = run_deployment_controller(fake.clone());
    let clusters = [cluster(&fake, "cluster", None)];
    ops::open(&clusters, &open_opts(), &mut Vec::new())
        .await
        .unwrap();
    // Someone wrote garbage into one annotation.
    let mut d = fake
        .get(
            "apps/v1",
            "Deployment",
            Some("capi-system"),
            "capi-controller-manager",
        )
        .unwrap();
    d["metadata"]["annotations"][SAVED] = "three".into();
    fake.put(d);
    // A Deployment pinned by hand, with no record and no annotation, that the window selects.
    let mut d = deployment("capi-system", "capi-extra", 0, capi("extra"));
    d["metadata"]["annotations"] = json!({SAVED: ""});
    fake.put(d);
    let mut out = Vec::new();
    let restored = ops::close(&clusters, &close_opts(), &mut out)
        .await
        .unwrap();
    let log = String::from_utf8(out).unwrap();
    assert_eq!(
        dep(&fake, "capi-system", "capi-controller-manager"),
        (1, None)
    );
    assert_eq!(dep(&fake, "capi-system", "capi-extra"), (1, None));
    assert!(
        log.contains("\"three\" is unreadable; restored to 1"),
        "{log}"
    );
    let notes: Vec<_> = restored.iter().filter(|r| r.note.is_some()).collect();
    assert_eq!(notes.len(), 2, "{restored:?}");
    let w = fake
        .get("handoff.dev/v1alpha1", "MoveWindow", None, "capi-move")
        .unwrap();
    let pinned = w["status"]["pinned"].as_array().unwrap();
    assert!(
        pinned
            .iter()
            .any(|p| p["note"].as_str().is_some_and(|n| n.contains("unreadable")))
    );
}

#[tokio::test]
async fn preflight_refuses_a_deployment_that_serves_a_fail_closed_webhook() {
    let fake = Arc::new(FakeApi::start().await);
    seed(&fake);
    fake.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "capi-webhook-service", "namespace": "capi-system"},
        "spec": {"selector": {"app": "capi-controller-manager"}, "ports": [{"port": 443}]}}));
    fake.put(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "capi-validating-webhook-configuration"},
        "webhooks": [{"name": "validation.cluster.cluster.x-k8s.io", "failurePolicy": "Fail",
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "capi-webhook-service", "namespace": "capi-system", "path": "/validate"}}},
            {"name": "ignored.cluster.x-k8s.io", "failurePolicy": "Ignore",
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "capi-webhook-service", "namespace": "capi-system"}}}]}));
    fake.put(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusters.cluster.x-k8s.io"},
        "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
            "names": {"plural": "clusters", "kind": "Cluster"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true}],
            "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "capi-webhook-service", "namespace": "capi-system"}}}}}}));
    let clusters = [cluster(&fake, "cluster", None)];
    let writes = fake.writes().len();
    let err = ops::open(&clusters, &open_opts(), &mut Vec::new())
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
    assert_eq!(
        fake.writes().len(),
        writes,
        "nothing written when preflight refuses"
    );

    let _c = run_deployment_controller(fake.clone());
    let opts = OpenOptions {
        allow_webhook_outage: true,
        ..open_opts()
    };
    let mut out = Vec::new();
    ops::open(&clusters, &opts, &mut out).await.unwrap();
    assert!(
        String::from_utf8(out)
            .unwrap()
            .contains("allowed by --allow-webhook-outage")
    );
    assert_eq!(
        dep(&fake, "capi-system", "capi-controller-manager"),
        (0, Some("3".into()))
    );
}

/// Kill `open` (then `close`) after each of its writes, run it again, and compare with a run
/// that was never interrupted.
#[tokio::test]
async fn a_run_killed_after_any_step_and_rerun_ends_in_the_same_state() {
    async fn fresh() -> (Arc<FakeApi>, tokio::task::JoinHandle<()>) {
        let fake = Arc::new(FakeApi::start().await);
        seed(&fake);
        let c = run_deployment_controller(fake.clone());
        (fake, c)
    }
    let (reference, _c) = fresh().await;
    let rc = [cluster(&reference, "cluster", None)];
    ops::open(&rc, &open_opts(), &mut Vec::new()).await.unwrap();
    let opened = snapshot(&reference);
    let open_writes = reference.writes().len();
    ops::close(&rc, &close_opts(), &mut Vec::new())
        .await
        .unwrap();
    let closed = snapshot(&reference);
    let close_writes = reference.writes().len() - open_writes;
    assert!(
        open_writes >= 6 && close_writes >= 6,
        "{open_writes} {close_writes}"
    );

    for n in 0..open_writes as u64 {
        let (fake, _c) = fresh().await;
        let cl = [cluster(&fake, "cluster", None)];
        fake.fail_writes_after(Some(n));
        let first = ops::open(&cl, &open_opts(), &mut Vec::new()).await;
        assert!(first.is_err(), "open should die after {n} writes");
        fake.fail_writes_after(None);
        ops::open(&cl, &open_opts(), &mut Vec::new()).await.unwrap();
        assert_eq!(
            snapshot(&fake),
            opened,
            "open killed after {n} writes, then re-run"
        );
    }
    for n in 0..close_writes as u64 {
        let (fake, _c) = fresh().await;
        let cl = [cluster(&fake, "cluster", None)];
        ops::open(&cl, &open_opts(), &mut Vec::new()).await.unwrap();
        fake.fail_writes_after(Some(n));
        let first = ops::close(&cl, &close_opts(), &mut Vec::new()).await;
        assert!(first.is_err(), "close should die after {n} writes");
        fake.fail_writes_after(None);
        ops::close(&cl, &close_opts(), &mut Vec::new())
            .await
            .unwrap();
        assert_eq!(
            snapshot(&fake),
            closed,
            "close killed after {n} writes, then re-run"
        );
    }
}

#[tokio::test]
async fn status_shows_windows_deployments_and_saved_counts() {
    let fake = Arc::new(FakeApi::start().await);
    seed(&fake);
    let _c = run_deployment_controller(fake.clone());
    let clusters = [cluster(&fake, "cluster", None)];
    ops::open(&clusters, &open_opts(), &mut Vec::new())
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
async fn a_target_that_fails_leaves_no_controller_stopped_and_close_finishes_the_rest() {
    let source = Arc::new(FakeApi::start().await);
    let target = Arc::new(FakeApi::start().await);
    seed(&source);
    seed(&target);
    let _c = run_deployment_controller(source.clone());
    let clusters = [
        cluster(&source, "source", Some(MoveRole::Source)),
        cluster(&target, "target", Some(MoveRole::Target)),
    ];
    // The target accepts reads but no writes: its window cannot be created.
    target.fail_writes_after(Some(0));
    assert!(
        ops::open(&clusters, &open_opts(), &mut Vec::new())
            .await
            .is_err()
    );
    // Nothing was pinned anywhere: every window is created before any Deployment is touched.
    assert_eq!(
        dep(&source, "capi-system", "capi-controller-manager"),
        (3, None)
    );
    assert_eq!(
        dep(&target, "capi-system", "capi-controller-manager"),
        (3, None)
    );
    // Closing with both clusters finishes on the source although the target has no window.
    target.fail_writes_after(None);
    let mut out = Vec::new();
    ops::close(
        &[clusters[1].clone(), clusters[0].clone()],
        &close_opts(),
        &mut out,
    )
    .await
    .unwrap();
    let log = String::from_utf8(out).unwrap();
    assert!(
        log.contains("target: there is no MoveWindow capi-move"),
        "{log}"
    );
    let w = source
        .get("handoff.dev/v1alpha1", "MoveWindow", None, "capi-move")
        .unwrap();
    assert_eq!(w["spec"]["state"], "Closed");
    // A name that exists nowhere is an error.
    let err = ops::close(
        &clusters,
        &CloseOptions {
            name: "nope".into(),
            ..close_opts()
        },
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("there is no MoveWindow nope"),
        "{err}"
    );
}

#[tokio::test]
async fn preflight_checks_the_selector_of_an_existing_window() {
    let fake = Arc::new(FakeApi::start().await);
    seed(&fake);
    // A window created by hand that selects the web frontend, which serves a fail-closed webhook.
    fake.put(json!({"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow", "metadata": {"name": "capi-move"},
        "spec": {"state": "Closed", "deploymentSelector": {"matchLabels": {"app": "frontend"}}}}));
    fake.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "frontend", "namespace": "web"},
        "spec": {"selector": {"app": "frontend"}, "ports": [{"port": 443}]}}));
    fake.put(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "web"},
        "webhooks": [{"name": "web.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "frontend", "namespace": "web"}}}]}));
    let err = ops::open(
        &[cluster(&fake, "cluster", None)],
        &open_opts(),
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("Deployment web/frontend backs Service web/frontend"),
        "{err}"
    );
    assert_eq!(dep(&fake, "web", "frontend"), (4, None));
}

#[tokio::test]
async fn a_restore_pinned_again_by_a_stale_replica_is_retried() {
    let fake = Arc::new(FakeApi::start().await);
    seed(&fake);
    let _c = run_deployment_controller(fake.clone());
    let clusters = [cluster(&fake, "cluster", None)];
    ops::open(&clusters, &open_opts(), &mut Vec::new())
        .await
        .unwrap();
    // A handoff replica whose cache lags 300 ms behind the close pins the Deployment again
    // whenever it sees it restored, within a millisecond, until it catches up.
    let repinner = {
        let fake = fake.clone();
        tokio::spawn(async move {
            let mut repinned = 0;
            let start = tokio::time::Instant::now();
            while start.elapsed() < Duration::from_millis(300) {
                if let Some(mut d) = fake.get(
                    "apps/v1",
                    "Deployment",
                    Some("capi-system"),
                    "capi-controller-manager",
                ) && d["spec"]["replicas"] != 0
                {
                    let asked = d["spec"]["replicas"].clone();
                    d["spec"]["replicas"] = 0.into();
                    d["metadata"]["annotations"][SAVED] = asked.to_string().into();
                    fake.put(d);
                    repinned += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            repinned
        })
    };
    ops::close(&clusters, &close_opts(), &mut Vec::new())
        .await
        .unwrap();
    assert!(
        repinner.await.unwrap() >= 1,
        "the stale replica never acted"
    );
    assert_eq!(
        dep(&fake, "capi-system", "capi-controller-manager"),
        (3, None)
    );
    let pins = fake
        .writes()
        .iter()
        .filter(|w| w.contains("capi-system/deployments/capi-controller-manager"))
        .count();
    assert!(pins >= 4, "close restored more than once: {pins}");
}
