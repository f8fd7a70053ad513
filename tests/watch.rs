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

/// Poll `check` until it holds. The watch delivers within milliseconds; the minute is for a
/// machine busy with other suites, and only bounds a test that would otherwise hang.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// handoff's state read from the cluster behind `proxy` by its own watches, tuned by `tune`,
/// once every cache has listed; the watches run until the set is dropped.
async fn watched(
    proxy: &FaultProxy,
    tune: impl FnOnce(&mut State),
) -> (Arc<State>, tokio::task::JoinSet<()>) {
    let mut state = State::new(Default::default());
    state.client = Some(proxy.client());
    tune(&mut state);
    let state = Arc::new(state);
    let mut watches = tokio::task::JoinSet::new();
    handoff::state::cluster::spawn_watches(&mut watches, proxy.client(), state.clone());
    eventually("caches synced", || async { state.is_synced() }).await;
    (state, watches)
}

/// Every watch has listed since its last failure, and readiness says so.
fn all_listed(state: &State) -> bool {
    let w = &state.watches;
    [&w.namespaces, &w.windows, &w.deployments]
        .iter()
        .all(|w| w.failing_for().is_none())
        && state.readiness().is_ok()
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
    let (state, _watches) = watched(&proxy, |s| {
        s.api_timeout = Duration::from_secs(1);
        s.stale_after = Duration::from_millis(300);
    })
    .await;
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let delete = fixture("delete-configmap-by-syncer.json");
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);

    // The API server goes away. Each watch fails on its own clock (they reconnect after their
    // own backoff): wait for each of the three to go stale, then readiness names every one.
    proxy.set_unavailable(true);
    let stale = |w: &handoff::state::WatchHealth| w.stale("", state.stale_after).is_some();
    eventually("every watch to go stale", || async {
        let w = &state.watches;
        stale(&w.namespaces) && stale(&w.windows) && stale(&w.deployments)
    })
    .await;
    let why = state.readiness().unwrap_err();
    for watch in ["namespace", "MoveWindow", "Deployment"] {
        assert!(
            why.contains(&format!("the {watch} watch has been failing")),
            "readiness names the {watch} watch: {why}"
        );
    }
    let r = allowed(&server, GUARD, &delete).await;
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("the namespace watch has been failing") && msg.contains("may be stale"),
        "{r}"
    );
    let r = allowed(&server, PIN, &fixture("create-deployment-capi.json")).await;
    assert_eq!(
        r["allowed"], false,
        "the pin cannot trust a stale window cache: {r}"
    );
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("the MoveWindow watch has been failing"),
        "{r}"
    );
    // Other users are still never held.
    let r = allowed(&server, GUARD, &fixture("delete-secret-by-admin.json")).await;
    assert_eq!(r["allowed"], true);

    proxy.set_unavailable(false);
    eventually("the watches to recover", || async { all_listed(&state) }).await;
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);
    server.stop().await;
}

/// A watch that failed proves nothing from its first error, long before `--stale-after`: the
/// guard and the pin read what they need from the API server instead, decide on what the read
/// says (both ways: a hold or a window the blind watch missed holds, and none passes), and deny
/// only when that read fails too. Each decision looks at its own watch alone: the proxy holds
/// the namespace watch's reconnection, so the other two fail first, whatever the machine's
/// speed, and the guard still decides on its proven view meanwhile.
#[tokio::test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
async fn a_failed_watch_is_blind_from_its_first_error_and_the_api_is_read_instead() {
    if skip() {
        return;
    }
    let (api, proxy) = cluster(NS, false).await;
    let api = Arc::new(api);
    let on_api = |yaml: String| {
        let api = api.clone();
        async move {
            tokio::task::spawn_blocking(move || api.apply(&yaml))
                .await
                .unwrap()
        }
    };
    // The Deployment behind the scale fixture, an application's for now (no provider label).
    on_api("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: capi-system\n".into()).await;
    on_api(support::apiserver::app_deployment(
        "capi-system",
        "capi-controller-manager",
        3,
    ))
    .await;
    let (state, _watches) = watched(&proxy, |s| {
        s.api_timeout = Duration::from_secs(2);
        // Neither staleness nor a quiet watch plays a part here: only the failure itself.
        s.stale_after = Duration::from_secs(3600);
        s.max_staleness = Duration::from_secs(3600);
    })
    .await;
    eventually("the scale fixture's Deployment cached", || async {
        state
            .deployments
            .get("capi-system", "capi-controller-manager")
            .is_some()
    })
    .await;
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let count = |prefix: &str| {
        proxy
            .requests()
            .iter()
            // A decision's reads; the watchers' own lists are paged (`limit=`).
            .filter(|r| r.starts_with(prefix) && !r.contains("watch=") && !r.contains("limit="))
            .count()
    };
    let ns_read = format!("GET /api/v1/namespaces/{NS}");
    let windows_read = "GET /apis/handoff.dev/v1alpha1/movewindows";
    let deployment_read = "GET /apis/apps/v1/namespaces/capi-system/deployments/";
    let delete = fixture("delete-configmap-by-syncer.json");
    let (capi, scale) = (
        fixture("create-deployment-capi.json"),
        fixture("scale-deployment.json"),
    );
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);
    assert_eq!(count(&ns_read), 0, "a proven view is not read again");

    // The namespace watch's reconnection waits at the proxy; the other two watches fail.
    proxy.hold(Some("GET /api/v1/namespaces?"));
    proxy.fail_watches(true);
    eventually("the MoveWindow and Deployment watches to fail", || async {
        state.watches.windows.failing_for().is_some()
            && state.watches.deployments.failing_for().is_some()
    })
    .await;
    eventually("the namespace watch to wait at the proxy", || async {
        proxy.held() >= 1
    })
    .await;
    assert!(state.watches.namespaces.failing_for().is_none());
    // The guard reads its own watch alone, which has not failed: its view still counts.
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);
    assert_eq!(count(&ns_read), 0, "the guard's view was not the blind one");

    // The pin's watches are blind: what it needs is read now. No window is open: a provider's
    // Deployment is stored as asked.
    let r = allowed(&server, PIN, &capi).await;
    assert_eq!(
        (r["allowed"].as_bool(), r.get("patch")),
        (Some(true), None),
        "{r}"
    );
    assert!(count(windows_read) >= 1, "the MoveWindows were read");
    // A window opened, and the scale fixture's Deployment labelled a provider's, while the
    // watches are blind: both seen by the reads, so both writes are pinned.
    on_api(
        "apiVersion: handoff.dev/v1alpha1\nkind: MoveWindow\nmetadata:\n  name: blind-move\nspec:\n  state: Open\n"
            .into(),
    )
    .await;
    on_api(support::apiserver::capi_deployment(
        "capi-system",
        "capi-controller-manager",
        Some(3),
    ))
    .await;
    let r = allowed(&server, PIN, &capi).await;
    assert!(
        r["allowed"] == true && r["patch"].is_string(),
        "pinned: {r}"
    );
    let r = allowed(&server, PIN, &scale).await;
    assert!(
        r["allowed"] == true && r["patch"].is_string(),
        "pinned: {r}"
    );
    assert!(
        count(deployment_read) >= 1,
        "the parent Deployment was read"
    );

    // The namespace watch fails too: from that first error its view proves nothing, and the
    // namespace is read, both ways.
    proxy.hold(None);
    eventually("the namespace watch to fail", || async {
        state.watches.namespaces.failing_for().is_some()
    })
    .await;
    assert!(state.readiness().is_ok(), "blind is not stale: still ready");
    assert_eq!(allowed(&server, GUARD, &delete).await["allowed"], true);
    assert_eq!(count(&ns_read), 1, "read instead of trusted");
    let held = (api.clone(), NS);
    tokio::task::spawn_blocking(move || namespace(&held.0, held.1, true))
        .await
        .unwrap();
    let r = allowed(&server, GUARD, &delete).await;
    assert_eq!(
        r["allowed"], false,
        "the hold the blind watch missed holds: {r}"
    );
    assert_eq!(count(&ns_read), 2);

    // Blind and unable to read: denied, saying both; the pin in doubt refuses a provider's
    // Deployment; anyone else is decided without a read.
    proxy.set_unavailable(true);
    let r = allowed(&server, GUARD, &delete).await;
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("the namespace watch failed") && msg.contains("reading namespace"),
        "{msg}"
    );
    let r = allowed(&server, PIN, &capi).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("reading the MoveWindows failed"),
        "{r}"
    );
    let before = proxy.requests().len();
    let r = allowed(&server, GUARD, &fixture("delete-secret-by-admin.json")).await;
    assert_eq!(r["allowed"], true);
    assert_eq!(
        proxy.requests().len(),
        before,
        "an admin's delete reads nothing"
    );

    // The watches list again: their views count again, and nothing is read.
    proxy.set_unavailable(false);
    proxy.fail_watches(false);
    eventually("the watches to list again", || async { all_listed(&state) }).await;
    let reads = count(&ns_read);
    let r = allowed(&server, GUARD, &delete).await;
    assert_eq!(r["allowed"], false, "the relisted view holds: {r}");
    assert_eq!(count(&ns_read), reads, "a proven view is not read again");
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
    // The read waits at the proxy until all eight deletes are in handoff at once: they
    // overlap by construction, not by the machine's speed.
    let read = format!("GET /api/v1/namespaces/{NS}");
    proxy.hold(Some(&read));
    let server = TestServer::start_with(state.clone(), Options::default()).await;
    let reads = || {
        proxy
            .requests()
            .iter()
            .filter(|r| r.starts_with(&read))
            .count()
    };
    let delete = fixture("delete-configmap-by-syncer.json");
    let release = async {
        eventually("eight deletes waiting on one held read", || async {
            server.app.metrics.in_flight.get() == 8 && proxy.held() == 1
        })
        .await;
        proxy.hold(None);
    };
    let (answers, ()) = tokio::join!(
        futures::future::join_all((0..8).map(|_| allowed(&server, GUARD, &delete))),
        release
    );
    for r in &answers {
        assert_eq!(r["allowed"], false, "{r}");
    }
    assert_eq!(reads(), 1, "one read for eight concurrent deletes");

    // The API server stops answering: the delete is denied with both reasons.
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
