//! The watch path where the API server must misbehave on cue: a real kube-apiserver behind the
//! fault proxy (`tests/support/fault_proxy.rs`), which counts handoff's requests, answers slowly
//! or is unavailable on cue. What a real API server shows by itself (holds added and lifted,
//! windows opening and closing, a restart, RBAC, a CRD installed late, a dead connection) is in
//! `tests/apiserver.rs`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use handoff::state::State;
use support::apiserver::{ApiServer, skip};
use support::fault_proxy::{FaultProxy, start_with_crd};
use support::https::{Options, Proto, TestServer, fixture};

const GUARD: &str = "/validate/sync-finalizer?timeout=10s";
const PIN: &str = "/mutate/move-window?timeout=10s";
const NS: &str = "kcp-33jbiactwhg0";
const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;
const FINALIZER: &str = "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";

/// Create or update a located namespace, held for the sync target or not (as the admin,
/// straight to the API server: not in the proxy's log).
fn namespace(api: &ApiServer, name: &str, held: bool) {
    let hold = match held {
        true => format!("\n    {FINALIZER}: glbc-migration"),
        false => String::new(),
    };
    api.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  annotations:\n    kcp.io/namespace-locator: '{LOCATOR}'{hold}\n"
    ));
}

/// An API server with `ns` located (and held or not), and the proxy in front of it.
async fn cluster(ns: &str, held: bool) -> (ApiServer, FaultProxy) {
    let (api, proxy) = start_with_crd().await;
    let ns = ns.to_string();
    let api = tokio::task::spawn_blocking(move || {
        namespace(&api, &ns, held);
        api
    })
    .await
    .unwrap();
    (api, proxy)
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
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn a_cache_miss_is_fetched_once_and_an_unreachable_api_fails_closed() {
    if skip() {
        return;
    }
    let (_api, proxy) = cluster("kcp-fresh", true).await;
    // No watches: every namespace is a cache miss.
    let mut state = State::new(Default::default());
    state.client = Some(proxy.client());
    state.api_timeout = Duration::from_secs(2);
    let state = Arc::new(state);
    let gets = || {
        proxy
            .requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/namespaces/kcp-fresh"))
            .count()
    };
    for _ in 0..3 {
        match state.namespace("kcp-fresh").await.0 {
            handoff::state::NamespaceLookup::Relevant(m) => assert_eq!(m.holds().len(), 1),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(gets(), 1, "fetched once, then served from the cache");

    // The API server goes away: a syncer's delete in an unknown namespace is denied with the
    // reason, anyone else's passes without a lookup.
    proxy.set_unavailable(true);
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

#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn a_watch_that_keeps_failing_makes_the_cache_stale_then_recovers() {
    if skip() {
        return;
    }
    let (_api, proxy) = cluster(NS, false).await;
    let mut state = State::new(Default::default());
    state.client = Some(proxy.client());
    state.api_timeout = Duration::from_secs(1);
    state.stale_after = Duration::from_millis(300);
    let state = Arc::new(state);
    let mut watches = tokio::task::JoinSet::new();
    handoff::state::cluster::spawn_watches(&mut watches, proxy.client(), state.clone());
    eventually("caches synced", || async { state.is_synced() }).await;
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let delete = fixture("delete-configmap-by-syncer.json");
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);

    // The API server goes away: the cache still says "not held", but after stale_after it is
    // no longer trusted.
    proxy.set_unavailable(true);
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

    proxy.set_unavailable(false);
    eventually("the watches to recover", || async {
        state.readiness().is_ok()
    })
    .await;
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);
    server.stop().await;
}

/// On a view the watch has not proven current, concurrent deletes of the sync target in one
/// namespace share a single read (the proxy answers slowly on cue), and a failed read denies.
#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn an_unproven_view_is_read_once_per_namespace_however_many_deletes_wait() {
    if skip() {
        return;
    }
    let (api, proxy) = cluster(NS, false).await;
    let mut state = State::new(Default::default());
    state.client = Some(proxy.client());
    state.max_staleness = Duration::ZERO;
    // Cached as "not held", by a watch that has gone quiet.
    state.namespaces.replace_all([(
        NS,
        handoff::rules::sync_finalizer::NamespaceMeta::from_annotations(
            Some(&[("kcp.io/namespace-locator".to_string(), LOCATOR.to_string())].into()),
            &state.ids,
        ),
    )]);
    let state = Arc::new(state);
    // The hold the quiet watch never delivered.
    let _api = tokio::task::spawn_blocking(move || {
        namespace(&api, NS, true);
        api
    })
    .await
    .unwrap();
    proxy.set_latency(Duration::from_millis(300));
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let reads = || {
        proxy
            .requests()
            .iter()
            .filter(|r| r.starts_with(&format!("GET /api/v1/namespaces/{NS}")))
            .count()
    };
    let delete = fixture("delete-configmap-by-syncer.json");
    let answers = futures::future::join_all((0..8).map(|_| allowed(&server, GUARD, &delete))).await;
    for r in &answers {
        assert_eq!(r["allowed"], false, "{r}");
    }
    assert_eq!(reads(), 1, "one read for eight concurrent deletes");

    // The API server stops answering: the delete is denied with both reasons.
    proxy.set_latency(Duration::ZERO);
    proxy.set_unavailable(true);
    let r = allowed(&server, GUARD, &delete).await;
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("the namespace watch") && msg.contains("reading namespace"),
        "{msg}"
    );
    // An admin is decided without any read.
    let before = proxy.requests().len();
    let r = allowed(&server, GUARD, &fixture("delete-secret-by-admin.json")).await;
    assert_eq!(r["allowed"], true);
    assert_eq!(proxy.requests().len(), before);
    server.stop().await;
}
