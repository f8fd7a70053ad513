//! The watch path: handoff's caches fed by kube-rs watches from an in-process API server that
//! speaks the real list/watch protocol, and the verdicts following what happens there.

mod support;

use std::sync::Arc;
use std::time::Duration;

use handoff::state::State;
use serde_json::json;
use support::fake_api::FakeApi;
use support::https::{Options, Proto, TestServer, fixture};

const GUARD: &str = "/validate/sync-finalizer?timeout=10s";
const PIN: &str = "/mutate/move-window?timeout=10s";
const NS: &str = "kcp-33jbiactwhg0";
const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;
const FINALIZER: &str = "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";

fn namespace(name: &str, held: bool) -> serde_json::Value {
    let mut ann = json!({ "kcp.io/namespace-locator": LOCATOR });
    if held {
        ann[FINALIZER] = "glbc-migration".into();
    }
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": ann}})
}

async fn start(fake: &FakeApi) -> (Arc<State>, TestServer) {
    let mut state = State::new(Default::default());
    state.client = Some(fake.client());
    state.api_timeout = Duration::from_secs(1);
    let state = Arc::new(state);
    handoff::state::cluster::spawn_watches(fake.client(), state.clone());
    eventually("caches synced", || async { state.is_synced() }).await;
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    (state, server)
}

/// Poll `check` for up to 10 s; the watch delivers within milliseconds, the margin is for
/// loaded CI machines.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

async fn allowed(server: &TestServer, path: &str, body: &[u8]) -> serde_json::Value {
    let mut c = server.connect(Proto::H1).await;
    let r = c.review(path, body.to_vec()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["response"].clone()
}

#[tokio::test]
async fn namespace_finalizer_added_modified_deleted_changes_the_verdict() {
    let fake = FakeApi::start().await;
    fake.put(namespace(NS, false));
    let (_state, server) = start(&fake).await;
    let delete = fixture("delete-configmap-by-syncer.json");

    // Synced from the initial list: no finalizer, the syncer may delete.
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);

    // The namespace gains its sync finalizer (MODIFIED): held.
    fake.put(namespace(NS, true));
    eventually("the hold to apply", || async {
        allowed(&server, GUARD, &delete).await["allowed"] == false
    })
    .await;
    let r = allowed(&server, GUARD, &delete).await;
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("glbc-migration")
    );

    // ...and loses it: released.
    fake.put(namespace(NS, false));
    eventually("the hold to lift", || async {
        allowed(&server, GUARD, &delete).await["allowed"] == true
    })
    .await;

    // Held again, then the namespace is deleted (DELETED): nothing left to hold.
    fake.put(namespace(NS, true));
    eventually("the hold to apply again", || async {
        allowed(&server, GUARD, &delete).await["allowed"] == false
    })
    .await;
    fake.remove("v1", "Namespace", None, NS);
    eventually("the deleted namespace to stop holding", || async {
        allowed(&server, GUARD, &delete).await["allowed"] == true
    })
    .await;

    // A namespace created later (ADDED) holds too.
    let mut other: serde_json::Value = serde_json::from_slice(&delete).unwrap();
    other["request"]["namespace"] = "kcp-added".into();
    let other = serde_json::to_vec(&other).unwrap();
    fake.put(namespace("kcp-added", true));
    eventually("an added namespace to hold", || async {
        allowed(&server, GUARD, &other).await["allowed"] == false
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_cache_miss_is_fetched_once_and_an_unreachable_api_fails_closed() {
    let fake = FakeApi::start().await;
    fake.put(namespace("kcp-fresh", true));
    // No watches: every namespace is a cache miss.
    let mut state = State::new(Default::default());
    state.client = Some(fake.client());
    state.api_timeout = Duration::from_secs(2);
    let state = Arc::new(state);
    let gets = || {
        fake.requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/namespaces/kcp-fresh"))
            .count()
    };
    for _ in 0..3 {
        match state.namespace("kcp-fresh").await.0 {
            handoff::state::NamespaceLookup::Relevant(m) => assert_eq!(m.finalizers.len(), 1),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(gets(), 1, "fetched once, then served from the cache");

    // The API server goes away: a syncer's delete in an unknown namespace is denied with the
    // reason, anyone else's passes without a lookup.
    fake.set_unavailable(true);
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let mut review: serde_json::Value =
        serde_json::from_slice(&fixture("delete-configmap-by-syncer.json")).unwrap();
    review["request"]["namespace"] = "kcp-unknown".into();
    let r = allowed(&server, GUARD, &serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("cannot read namespace \"kcp-unknown\"") && msg.contains("fail closed"),
        "{msg}"
    );
    assert_eq!(r["auditAnnotations"]["reason"], "state-unavailable");

    review["request"]["userInfo"]["username"] = "admin".into();
    let r = allowed(&server, GUARD, &serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(r["allowed"], true);
    server.stop().await;
}

fn capi_deployment(saved: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": "capi-controller-manager", "namespace": "capi-system",
            "labels": {"cluster.x-k8s.io/provider": "cluster-api", "clusterctl.cluster.x-k8s.io": ""},
            "annotations": {"handoff.dev/replicas-before-move": saved}
        },
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "capi"}},
                 "template": {"metadata": {"labels": {"app": "capi"}}, "spec": {"containers": [{"name": "m", "image": "x"}]}}}
    })
}

fn move_window(state: &str) -> serde_json::Value {
    json!({"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow",
           "metadata": {"name": "capi-move"}, "spec": {"state": state}})
}

#[tokio::test]
async fn windows_and_deployments_from_watches_drive_the_pin() {
    let fake = FakeApi::start().await;
    fake.put(capi_deployment("4"));
    let (state, server) = start(&fake).await;
    let create = fixture("create-deployment-capi.json");
    let scale = fixture("scale-deployment.json");

    let r = allowed(&server, PIN, &create).await;
    assert!(r.get("patch").is_none(), "no window yet: {r}");

    fake.put(move_window("Open"));
    eventually("the window to open", || async {
        !state.windows.open().is_empty()
    })
    .await;
    let r = allowed(&server, PIN, &create).await;
    assert_eq!(r["patchType"], "JSONPatch");
    let r = allowed(&server, PIN, &scale).await;
    assert!(
        r["warnings"][0].as_str().unwrap().contains("restored to 4"),
        "{r}"
    );

    // The saved count changes in the cluster; the scale warning follows it.
    fake.put(capi_deployment("6"));
    eventually("the new saved count", || async {
        allowed(&server, PIN, &scale).await["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("restored to 6"))
    })
    .await;

    fake.put(move_window("Closed"));
    eventually("the window to close", || async {
        state.windows.open().is_empty()
    })
    .await;
    let r = allowed(&server, PIN, &create).await;
    assert!(r.get("patch").is_none(), "window closed: {r}");
    server.stop().await;
}

#[tokio::test]
async fn a_watch_that_keeps_failing_makes_the_cache_stale_then_recovers() {
    let fake = FakeApi::start().await;
    fake.put(namespace(NS, false));
    let mut state = State::new(Default::default());
    state.client = Some(fake.client());
    state.api_timeout = Duration::from_secs(1);
    state.stale_after = Duration::from_millis(300);
    let state = Arc::new(state);
    handoff::state::cluster::spawn_watches(fake.client(), state.clone());
    eventually("caches synced", || async { state.is_synced() }).await;
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let delete = fixture("delete-configmap-by-syncer.json");
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);

    // The API server goes away: the cache still says "not held", but after stale_after it is
    // no longer trusted.
    fake.set_unavailable(true);
    eventually("the cache to go stale", || async {
        state.readiness().is_err()
    })
    .await;
    let why = state.readiness().unwrap_err();
    assert!(why.contains("watch has been failing"), "{why}");
    let r = allowed(&server, GUARD, &delete).await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("may be stale"),
        "{r}"
    );
    let r = allowed(&server, PIN, &fixture("create-deployment-capi.json")).await;
    assert_eq!(
        r["allowed"], false,
        "the pin cannot trust a stale window cache: {r}"
    );
    // Other users are still never held.
    let r = allowed(&server, GUARD, &fixture("delete-secret-by-admin.json")).await;
    assert_eq!(r["allowed"], true);

    fake.set_unavailable(false);
    eventually("the watches to recover", || async {
        state.readiness().is_ok()
    })
    .await;
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);
    server.stop().await;
}
