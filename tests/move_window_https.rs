//! The move-window pin over real HTTPS with the recorded Deployment writes: the base64
//! JSONPatch is decoded and applied to the object the API server sent, as the API server does.

mod support;

use std::sync::Arc;

use handoff::resources::move_window::{MoveWindow, MoveWindowSpec, WindowState};
use handoff::state::State;
use handoff::state::windows::DeploymentMeta;
use support::https::{BOTH, Options, TestServer, fixture, fixture_state};

const PATH: &str = "/mutate/move-window?timeout=10s";
const SAVED: &str = "handoff.dev/replicas-before-move";

fn window(state: WindowState) -> MoveWindow {
    MoveWindow::new(
        "capi-move",
        MoveWindowSpec {
            state,
            deployment_selector: None,
            reason: Some("test".into()),
            role: None,
            stop: None,
        },
    )
}

/// Fixture namespaces, an open window, and the recorded Deployment with a saved count of 3.
fn pinned_state() -> State {
    let state = fixture_state();
    state.windows.upsert(&window(WindowState::Open));
    let labels = [
        ("cluster.x-k8s.io/provider", "cluster-api"),
        ("clusterctl.cluster.x-k8s.io", ""),
        ("control-plane", "controller-manager"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let ann = [(SAVED.to_string(), "3".to_string())].into_iter().collect();
    state.deployments.upsert(
        "capi-system",
        "capi-controller-manager",
        DeploymentMeta::new(Some(&labels), Some(&ann)),
    );
    state
}

/// Apply the response's patch to the request's object.
fn patched(review: &serde_json::Value, response: &serde_json::Value) -> serde_json::Value {
    let mut obj = review["request"]["object"].clone();
    if let Some(p) = response["patch"].as_str() {
        assert_eq!(response["patchType"], "JSONPatch");
        let ops = handoff::admission::decode_patch(p).expect("base64 JSONPatch");
        let patch: json_patch::Patch = serde_json::from_value(ops).expect("RFC 6902 patch");
        json_patch::patch(&mut obj, &patch).expect("patch applies to the object");
    }
    obj
}

/// (fixture, replicas after, saved count after, restore count in the warning)
const PINNED: &[(&str, i64, Option<&str>, &str)] = &[
    ("create-deployment-capi.json", 0, Some("1"), "restored to 1"),
    (
        "create-deployment-dryrun.json",
        0,
        Some("1"),
        "restored to 1",
    ),
    (
        "apply-deployment-client-side.json",
        0,
        Some("2"),
        "restored to 2",
    ),
    (
        "apply-deployment-server-side-1.json",
        0,
        Some("3"),
        "restored to 3",
    ),
    (
        "apply-deployment-server-side-2.json",
        0,
        Some("3"),
        "restored to 3",
    ),
    (
        "apply-deployment-server-side-3.json",
        0,
        Some("3"),
        "restored to 3",
    ),
    (
        "apply-deployment-server-side-4.json",
        0,
        Some("3"),
        "restored to 3",
    ),
    (
        "apply-deployment-server-side-5.json",
        0,
        Some("3"),
        "restored to 3",
    ),
    (
        "patch-deployment-annotate.json",
        0,
        Some("5"),
        "restored to 5",
    ),
    // A Scale cannot carry the annotation: it is pinned, and the parent's saved 3 stands.
    ("scale-deployment.json", 0, None, "restored to 3"),
    (
        "scale-deployment-preconditions.json",
        0,
        None,
        "restored to 3",
    ),
];

#[tokio::test]
async fn recorded_writes_are_pinned_and_idempotent() {
    let server = TestServer::start(pinned_state()).await;
    for proto in BOTH {
        let mut client = server.connect(proto).await;
        for (file, replicas, saved, restore) in PINNED {
            let body = fixture(file);
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let reply = client.review(PATH, body).await;
            assert_eq!(reply.status, 200, "{file}: {}", reply.text());
            let v = reply.json();
            let r = &v["response"];
            assert_eq!(r["uid"], review["request"]["uid"], "{file}");
            assert_eq!(r["allowed"], true, "{file}");
            let obj = patched(&review, r);
            assert_eq!(
                obj["spec"]["replicas"], *replicas,
                "{file} {proto:?}: {obj}"
            );
            assert_eq!(
                obj["metadata"]["annotations"][SAVED].as_str(),
                *saved,
                "{file}"
            );
            let warnings = r["warnings"].as_array().expect("a warning kubectl shows");
            let w = warnings[0].as_str().unwrap();
            assert!(
                w.contains("MoveWindow \"capi-move\"") && w.contains(restore),
                "{file}: {w}"
            );
            assert_eq!(r["auditAnnotations"]["decision"], "pin", "{file}");
            // Other annotations survive (the map was added to, not replaced).
            if let Some(a) = review["request"]["object"]["metadata"]["annotations"].as_object() {
                for k in a.keys() {
                    assert!(
                        obj["metadata"]["annotations"].get(k).is_some(),
                        "{file}: lost {k}"
                    );
                }
            }

            // The API server may call again with the mutated object: nothing more to patch.
            let mut again = review.clone();
            again["request"]["object"] = obj.clone();
            let reply = client
                .review(PATH, serde_json::to_vec(&again).unwrap())
                .await;
            let r2 = &reply.json()["response"];
            assert_eq!(r2["allowed"], true);
            assert!(
                r2.get("patch").is_none(),
                "{file}: second call patched: {r2}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn a_dropped_annotation_is_carried_over_from_old_object() {
    let server = TestServer::start(pinned_state()).await;
    let mut client = server.connect(support::https::Proto::H2).await;
    // Server-side apply of replicas: 0 whose manifest does not carry the annotation.
    let mut review: serde_json::Value =
        serde_json::from_slice(&fixture("apply-deployment-server-side-5.json")).unwrap();
    review["request"]["object"]["spec"]["replicas"] = 0.into();
    review["request"]["oldObject"]["spec"]["replicas"] = 0.into();
    review["request"]["oldObject"]["metadata"]["annotations"][SAVED] = "7".into();
    let reply = client
        .review(PATH, serde_json::to_vec(&review).unwrap())
        .await;
    let r = &reply.json()["response"];
    let obj = patched(&review, r);
    assert_eq!(obj["spec"]["replicas"], 0);
    assert_eq!(obj["metadata"]["annotations"][SAVED], "7");
    server.stop().await;
}

#[tokio::test]
async fn no_open_window_no_patch() {
    let state = fixture_state();
    state.windows.upsert(&window(WindowState::Closed));
    let server = TestServer::start_with(Arc::new(state), Options::default()).await;
    for proto in BOTH {
        let mut client = server.connect(proto).await;
        for (file, ..) in PINNED {
            let reply = client.review(PATH, fixture(file)).await;
            let r = &reply.json()["response"];
            assert_eq!(r["allowed"], true, "{file}");
            assert!(
                r.get("patch").is_none() && r.get("warnings").is_none(),
                "{file}: {r}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn own_deployment_and_unselected_deployments_pass() {
    let server = TestServer::start(pinned_state()).await;
    let mut client = server.connect(support::https::Proto::H1).await;
    let mut review: serde_json::Value =
        serde_json::from_slice(&fixture("create-deployment-capi.json")).unwrap();
    review["request"]["namespace"] = "handoff-system".into();
    review["request"]["name"] = "handoff-pin".into();
    let r = client
        .review(PATH, serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(
        r.json()["response"]["allowed"],
        true,
        "own Deployment pinned"
    );
    assert!(
        r.json()["response"].get("patch").is_none(),
        "own Deployment pinned"
    );

    let mut review: serde_json::Value =
        serde_json::from_slice(&fixture("create-deployment-capi.json")).unwrap();
    review["request"]["object"]["metadata"]["labels"] = serde_json::json!({"app": "web"});
    let r = client
        .review(PATH, serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(
        r.json()["response"]["allowed"],
        true,
        "unselected Deployment pinned"
    );
    assert!(
        r.json()["response"].get("patch").is_none(),
        "unselected Deployment pinned"
    );
    server.stop().await;
}

#[tokio::test]
async fn unsynced_windows_and_unreadable_selectors_fail_closed() {
    // Before the first list of MoveWindows: refuse, do not guess "no window".
    let state = State::new(Default::default());
    let server = TestServer::start_with(Arc::new(state), Options::default()).await;
    let mut client = server.connect(support::https::Proto::H1).await;
    let r = client
        .review(PATH, fixture("create-deployment-capi.json"))
        .await;
    let r = &r.json()["response"];
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("not yet read the MoveWindows"),
        "{r}"
    );
    server.stop().await;

    // An open window whose selector cannot be evaluated.
    let state = fixture_state();
    let mut w = window(WindowState::Open);
    w.spec.deployment_selector = Some(
        serde_json::from_value(
            serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "exists"}]}),
        )
        .unwrap(),
    );
    w.metadata.name = Some("typo".into());
    state.windows.upsert(&w);
    let server = TestServer::start_with(Arc::new(state), Options::default()).await;
    let mut client = server.connect(support::https::Proto::H2).await;
    let r = client
        .review(PATH, fixture("create-deployment-capi.json"))
        .await;
    let r = &r.json()["response"];
    assert_eq!(r["allowed"], false, "{r}");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("MoveWindow \"typo\" is open") && msg.contains("exists"),
        "{msg}"
    );
    // A Deployment no Cluster API selector would pick passes.
    let mut other: serde_json::Value =
        serde_json::from_slice(&fixture("create-deployment-capi.json")).unwrap();
    other["request"]["object"]["metadata"]["labels"] = serde_json::json!({"app": "web"});
    let r = client
        .review(PATH, serde_json::to_vec(&other).unwrap())
        .await;
    assert_eq!(r.json()["response"]["allowed"], true);
    server.stop().await;
}

/// The recorded `kubectl scale`, aimed at `namespace/name`.
fn scale_of(namespace: &str, name: &str) -> Vec<u8> {
    let mut v: serde_json::Value =
        serde_json::from_slice(&fixture("scale-deployment.json")).unwrap();
    v["request"]["namespace"] = namespace.into();
    v["request"]["name"] = name.into();
    v["request"]["object"]["metadata"]["namespace"] = namespace.into();
    v["request"]["object"]["metadata"]["name"] = name.into();
    serde_json::to_vec(&v).unwrap()
}

fn with_app(state: State) -> State {
    let labels = [("app".to_string(), "web".to_string())].into();
    state
        .deployments
        .upsert("shop", "web", DeploymentMeta::new(Some(&labels), None));
    state
}

/// docs/ARCHITECTURE.md §1.3: the `deployments/scale` entry sees every scale-up in the cluster, and an
/// application's is never refused, whatever handoff cannot know.
#[tokio::test]
async fn an_apps_scale_up_passes_whatever_the_pin_cannot_know() {
    let unread = with_app(State::new(Default::default()));
    let stale = {
        let mut s = with_app(fixture_state());
        s.windows.upsert(&window(WindowState::Open));
        s.stale_after = std::time::Duration::ZERO;
        s.watches.windows.failed("connection refused");
        s
    };
    let invalid = {
        let s = with_app(fixture_state());
        let mut w = window(WindowState::Open);
        w.spec.deployment_selector = Some(
            serde_json::from_value(
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "exists"}]}),
            )
            .unwrap(),
        );
        s.windows.upsert(&w);
        s
    };
    let parent_unknown = {
        // An open window, and an API server that does not answer for the parent.
        let mut s = fixture_state();
        s.windows.upsert(&window(WindowState::Open));
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        s.client = Some(kube::Client::try_from(config).unwrap());
        s
    };
    for (case, state) in [
        ("windows unread", unread),
        ("window watch stale", stale),
        ("open window with an invalid selector", invalid),
        ("open window, parent unknown", parent_unknown),
    ] {
        let server = TestServer::start_with(Arc::new(state), Options::default()).await;
        for proto in BOTH {
            let mut client = server.connect(proto).await;
            let r = client.review(PATH, scale_of("shop", "web")).await;
            let r = &r.json()["response"];
            assert_eq!(r["allowed"], true, "{case}: {r}");
            assert!(r.get("patch").is_none(), "{case}: {r}");
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn a_pinned_controllers_scale_up_is_still_pinned_with_the_deployment_watch_down() {
    let mut state = pinned_state();
    state.stale_after = std::time::Duration::ZERO;
    state.watches.deployments.failed("connection refused");
    let server = TestServer::start_with(Arc::new(state), Options::default()).await;
    let mut client = server.connect(support::https::Proto::H2).await;
    let r = client
        .review(PATH, scale_of("capi-system", "capi-controller-manager"))
        .await;
    let r = &r.json()["response"];
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(r["patchType"], "JSONPatch", "{r}");
    assert!(
        r["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("restored to 3")),
        "{r}"
    );
    server.stop().await;
}
