//! Proves that `support::fake_api::FakeApi` speaks enough of the real Kubernetes
//! API for an unmodified `kube::Client`, `watcher` and `metadata_watcher`.

mod support;

use std::fmt::Debug;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PartialObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::core::Expression;
#[allow(deprecated)]
// kube 5 deprecates it in favour of Api<PartialObjectMeta<K>>; still tested.
use kube::runtime::metadata_watcher;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use support::fake_api::FakeApi;
use tokio::time::{Instant, timeout};

const WAIT: Duration = Duration::from_secs(5);

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

fn deployment(ns: &str, name: &str, labels: Value, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": {"keep": "me"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    })
}

/// The `Status` code of a kube API error.
fn api_code<T: Debug>(res: Result<T, kube::Error>) -> (u16, String) {
    match res {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn next<S: Stream + Unpin>(stream: &mut S) -> S::Item {
    timeout(WAIT, stream.next())
        .await
        .expect("timed out waiting for a stream item")
        .expect("stream ended")
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn names<K: Resource>(items: &[K]) -> Vec<String> {
    items
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn namespace_crud_over_http() {
    let fake = FakeApi::start().await;
    let api: Api<Namespace> = Api::all(fake.client());
    let pp = PostParams::default();

    let created = api
        .create(&pp, &typed(namespace("alpha", json!({"team": "a"}))))
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().expect("uid");
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.labels()["kubernetes.io/metadata.name"], "alpha");
    assert_eq!(
        created.status.unwrap().phase.as_deref(),
        Some("Active"),
        "namespaces are Active"
    );

    let dup = api.create(&pp, &typed(namespace("alpha", json!({})))).await;
    assert_eq!(api_code(dup), (409, "AlreadyExists".into()));

    api.create(&pp, &typed(namespace("beta", json!({"team": "b"}))))
        .await
        .unwrap();

    let got = api.get("alpha").await.unwrap();
    assert_eq!(got.metadata.uid.as_deref(), Some(uid.as_str()));

    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&all.items), ["alpha", "beta"]);
    assert!(all.metadata.resource_version.is_some());
    let b_only = api
        .list(&ListParams::default().labels("team=b"))
        .await
        .unwrap();
    assert_eq!(names(&b_only.items), ["beta"]);

    let patched = api
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": null, "moved": "yes"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.labels().get("moved").map(String::as_str),
        Some("yes")
    );
    assert!(!patched.labels().contains_key("team"));
    assert!(patched.resource_version().unwrap().parse::<u64>().unwrap() > rv1);
    let stored = fake.get("v1", "Namespace", None, "alpha").unwrap();
    assert_eq!(stored["metadata"]["labels"]["moved"], "yes");

    api.delete("alpha", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("alpha").await.unwrap().is_none());
    assert_eq!(api_code(api.get("alpha").await), (404, "NotFound".into()));
    assert!(fake.get("v1", "Namespace", None, "alpha").is_none());
    assert_eq!(fake.list("v1", "Namespace").len(), 1);

    assert_eq!(
        fake.writes(),
        [
            "POST /api/v1/namespaces",
            "POST /api/v1/namespaces",
            "POST /api/v1/namespaces",
            "PATCH /api/v1/namespaces/alpha",
            "DELETE /api/v1/namespaces/alpha",
        ]
    );
    assert!(
        fake.requests()
            .contains(&"GET /api/v1/namespaces/alpha".to_string())
    );
}

#[tokio::test]
async fn deployment_json_patch_scale_and_status() {
    let fake = FakeApi::start().await;
    fake.put(deployment("shop", "web", json!({"app": "web"}), 3));
    let api: Api<Deployment> = Api::namespaced(fake.client(), "shop");
    let pp = PatchParams::default();

    let patch: Patch<()> = Patch::Json(typed(json!([
        {"op": "test", "path": "/spec/replicas", "value": 3},
        {"op": "add", "path": "/metadata/annotations/handoff.dev~1replicas-before-move", "value": "3"},
        {"op": "replace", "path": "/spec/replicas", "value": 0},
    ])));
    let d = api.patch("web", &pp, &patch).await.unwrap();
    assert_eq!(d.annotations()["handoff.dev/replicas-before-move"], "3");
    assert_eq!(d.annotations()["keep"], "me");
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));
    assert_eq!(d.metadata.generation, Some(2));

    // A failing `test` rejects the whole patch with 422 and changes nothing.
    let failing: Patch<()> = Patch::Json(typed(json!([
        {"op": "replace", "path": "/spec/replicas", "value": 7},
        {"op": "test", "path": "/spec/replicas", "value": 3},
    ])));
    assert_eq!(
        api_code(api.patch("web", &pp, &failing).await),
        (422, "Invalid".into())
    );
    let stored = fake
        .get("apps/v1", "Deployment", Some("shop"), "web")
        .unwrap();
    assert_eq!(stored["spec"]["replicas"], 0);

    // Scale subresource.
    let scale = api.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(0));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=web"));
    let scale = api
        .patch_scale("web", &pp, &Patch::Merge(json!({"spec": {"replicas": 2}})))
        .await
        .unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    let stored = fake
        .get("apps/v1", "Deployment", Some("shop"), "web")
        .unwrap();
    assert_eq!(stored["spec"]["replicas"], 2);

    // Status subresource changes only .status; main writes ignore .status.
    let d = api
        .patch_status(
            "web",
            &pp,
            &Patch::Merge(
                json!({"spec": {"replicas": 9}, "status": {"replicas": 2, "readyReplicas": 2}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(d.status.as_ref().unwrap().ready_replicas, Some(2));
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(2));
    let d = api
        .patch(
            "web",
            &pp,
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"readyReplicas": 0}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(d.labels()["x"], "y");
    assert_eq!(d.status.as_ref().unwrap().ready_replicas, Some(2));

    // Remove the escaped key again.
    let remove: Patch<()> = Patch::Json(typed(json!([
        {"op": "remove", "path": "/metadata/annotations/handoff.dev~1replicas-before-move"},
    ])));
    let d = api.patch("web", &pp, &remove).await.unwrap();
    assert!(
        !d.annotations()
            .contains_key("handoff.dev/replicas-before-move")
    );

    let writes = fake.writes();
    assert_eq!(writes.len(), 6, "{writes:?}");
    assert!(writes[0].starts_with("PATCH /apis/apps/v1/namespaces/shop/deployments/web"));
    assert!(writes[2].starts_with("PATCH /apis/apps/v1/namespaces/shop/deployments/web/scale"));
    assert!(writes[3].starts_with("PATCH /apis/apps/v1/namespaces/shop/deployments/web/status"));
}

#[tokio::test]
async fn replace_conflicts_finalizers_and_apply() {
    let fake = FakeApi::start().await;
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "default");
    let cm: ConfigMap = typed(json!({"metadata": {"name": "cfg"}, "data": {"a": "1"}}));
    let created = api.create(&PostParams::default(), &cm).await.unwrap();

    // Someone else writes; our copy is now stale.
    let mut other = fake.get("v1", "ConfigMap", Some("default"), "cfg").unwrap();
    other["data"]["a"] = json!("2");
    fake.put(other);
    let mut stale = created.clone();
    stale.data.as_mut().unwrap().insert("a".into(), "3".into());
    assert_eq!(
        api_code(api.replace("cfg", &PostParams::default(), &stale).await),
        (409, "Conflict".into())
    );
    let mut fresh = api.get("cfg").await.unwrap();
    fresh.data.as_mut().unwrap().insert("a".into(), "3".into());
    let replaced = api
        .replace("cfg", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(replaced.data.unwrap()["a"], "3");
    assert_eq!(replaced.metadata.uid, created.metadata.uid);

    // Creating an object that carries a resourceVersion fails like on a real server.
    assert_eq!(
        api_code(api.create(&PostParams::default(), &fresh).await).0,
        500
    );

    // Finalizers hold deletion until removed.
    api.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["handoff.dev/hold"]}})),
    )
    .await
    .unwrap();
    api.delete("cfg", &DeleteParams::default()).await.unwrap();
    let held = api.get("cfg").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("cfg").await.unwrap().is_none());

    // Server-side apply creates, then merges.
    let ssa = PatchParams::apply("fake-api-test");
    let applied = api
        .patch(
            "applied",
            &ssa,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied"}, "data": {"x": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["x"], "1");
    let applied = api
        .patch(
            "applied",
            &ssa,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied"}, "data": {"y": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap().len(), 2);

    // dryRun does not persist.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry, &typed(json!({"metadata": {"name": "dry"}})))
        .await
        .unwrap();
    assert!(
        fake.get("v1", "ConfigMap", Some("default"), "dry")
            .is_none()
    );
}

#[tokio::test]
async fn custom_resource_status_subresource_and_discovery() {
    let fake = FakeApi::start().await;
    let client = fake.client();
    let gvk = GroupVersionKind::gvk("handoff.dev", "v1alpha1", "MoveWindow");
    let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
    assert_eq!(ar.plural, "movewindows");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");

    let w = DynamicObject::new("w1", &ar).data(json!({
        "spec": {"namespaces": ["shop"]},
        "status": {"phase": "ignored-on-create"},
    }));
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert!(created.data.get("status").is_none());

    let pp = PatchParams::default();
    let opened = api
        .patch_status(
            "w1",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Open"}})),
        )
        .await
        .unwrap();
    assert_eq!(opened.data["status"]["phase"], "Open");
    assert_eq!(opened.data["spec"]["namespaces"][0], "shop");
    assert_eq!(opened.metadata.generation, Some(1));

    let mut edited = opened.clone();
    edited.data["spec"]["namespaces"] = json!(["shop", "db"]);
    edited.data["status"]["phase"] = json!("Closed");
    let replaced = api
        .replace("w1", &PostParams::default(), &edited)
        .await
        .unwrap();
    assert_eq!(replaced.data["status"]["phase"], "Open");
    assert_eq!(replaced.data["spec"]["namespaces"][1], "db");
    assert_eq!(replaced.metadata.generation, Some(2));

    let stored = fake
        .get("handoff.dev/v1alpha1", "MoveWindow", None, "w1")
        .unwrap();
    assert_eq!(stored["status"]["phase"], "Open");
}

#[tokio::test]
async fn watcher_sees_put_and_remove() {
    let fake = FakeApi::start().await;
    fake.put(namespace("pre", json!({})));
    let api: Api<Namespace> = Api::all(fake.client());
    let mut stream = watcher(api, watcher::Config::default()).boxed();

    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::Init
    ));
    match next(&mut stream).await.unwrap() {
        watcher::Event::InitApply(ns) => assert_eq!(ns.name_any(), "pre"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::InitDone
    ));

    fake.put(namespace("b", json!({})));
    match next(&mut stream).await.unwrap() {
        watcher::Event::Apply(ns) => assert_eq!(ns.name_any(), "b"),
        other => panic!("unexpected {other:?}"),
    }
    fake.put(namespace("b", json!({"moved": "yes"})));
    match next(&mut stream).await.unwrap() {
        watcher::Event::Apply(ns) => assert_eq!(ns.labels()["moved"], "yes"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(fake.remove("v1", "Namespace", None, "pre"));
    assert!(!fake.remove("v1", "Namespace", None, "pre"));
    match next(&mut stream).await.unwrap() {
        watcher::Event::Delete(ns) => assert_eq!(ns.name_any(), "pre"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn streaming_list_watcher() {
    let fake = FakeApi::start().await;
    fake.put(namespace("pre", json!({})));
    let api: Api<Namespace> = Api::all(fake.client());
    let mut stream = watcher(api, watcher::Config::default().streaming_lists()).boxed();
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::Init
    ));
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::InitApply(_)
    ));
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::InitDone
    ));
    fake.put(namespace("b", json!({})));
    match next(&mut stream).await.unwrap() {
        watcher::Event::Apply(ns) => assert_eq!(ns.name_any(), "b"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.contains("sendInitialEvents=true"))
    );
}

#[tokio::test]
async fn metadata_watcher_feeds_a_reflector() {
    let fake = FakeApi::start().await;
    fake.put(namespace("pre", json!({"a": "1"})));
    let api: Api<Namespace> = Api::all(fake.client());

    let meta = api.get_metadata("pre").await.unwrap();
    assert_eq!(meta.labels()["a"], "1");
    let metas = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(names(&metas.items), ["pre"]);

    #[allow(deprecated)]
    let events = metadata_watcher(api, watcher::Config::default());
    // The wire format really is PartialObjectMetadata(List) when asked for.
    let client = fake.client();
    let raw = |path: &str, accept: &str| {
        http::Request::get(path)
            .header(http::header::ACCEPT, accept)
            .body(Vec::new())
            .unwrap()
    };
    let list: Value = client
        .request(raw(
            "/api/v1/namespaces",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        ))
        .await
        .unwrap();
    assert_eq!(list["kind"], "PartialObjectMetadataList");
    assert_eq!(list["items"][0]["kind"], "PartialObjectMetadata");
    assert!(list["items"][0].get("spec").is_none());
    let one: Value = client
        .request(raw(
            "/api/v1/namespaces/pre",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        ))
        .await
        .unwrap();
    assert_eq!(one["kind"], "PartialObjectMetadata");
    assert!(one.get("status").is_none());
    let lines = client
        .request_text(raw(
            "/api/v1/namespaces?watch=true&timeoutSeconds=0&allowWatchBookmarks=true",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        ))
        .await
        .unwrap();
    let lines: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(lines[1]["type"], "BOOKMARK");

    let (reader, writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let stream = reflector::reflector(writer, events)
        .default_backoff()
        .touched_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));

    timeout(WAIT, reader.wait_until_ready())
        .await
        .expect("store ready in time")
        .unwrap();
    assert_eq!(
        names(
            &reader
                .state()
                .iter()
                .map(|o| (**o).clone())
                .collect::<Vec<_>>()
        ),
        ["pre"]
    );

    fake.put(namespace("b", json!({})));
    wait_for("b added", || reader.get(&ObjectRef::new("b")).is_some()).await;
    fake.put(namespace("b", json!({"moved": "yes"})));
    wait_for("b modified", || {
        reader
            .get(&ObjectRef::new("b"))
            .is_some_and(|o| o.labels().get("moved").is_some_and(|v| v == "yes"))
    })
    .await;
    fake.remove("v1", "Namespace", None, "pre");
    wait_for("pre deleted", || {
        reader.get(&ObjectRef::new("pre")).is_none()
    })
    .await;
    assert_eq!(reader.state().len(), 1);
    task.abort();

    // kube 5's replacement: a plain watcher over Api<PartialObjectMeta<K>>.
    let meta_api: Api<PartialObjectMeta<Namespace>> = Api::all(fake.client());
    let mut stream = watcher(meta_api, watcher::Config::default()).boxed();
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::Init
    ));
    match next(&mut stream).await.unwrap() {
        watcher::Event::InitApply(m) => assert_eq!(m.labels()["moved"], "yes"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::InitDone
    ));
    fake.remove("v1", "Namespace", None, "b");
    match next(&mut stream).await.unwrap() {
        watcher::Event::Delete(m) => assert_eq!(m.name_any(), "b"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn label_selectors_filter_lists_and_watches() {
    let fake = FakeApi::start().await;
    fake.put(deployment(
        "shop",
        "web",
        json!({"app": "web", "tier": "front", "env": "prod"}),
        1,
    ));
    fake.put(deployment(
        "shop",
        "api",
        json!({"app": "api", "tier": "back", "env": "staging"}),
        1,
    ));
    fake.put(deployment(
        "shop",
        "canary",
        json!({"app": "web", "tier": "front", "env": "prod", "canary": "true"}),
        1,
    ));
    fake.put(deployment("other", "web", json!({"app": "web"}), 1));
    let client = fake.client();
    let shop: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    let all: Api<Deployment> = Api::all(client);

    let list = |api: Api<Deployment>, lp: ListParams| async move {
        names(&api.list(&lp).await.unwrap().items)
    };
    let lp = ListParams::default;
    assert_eq!(
        list(shop.clone(), lp().labels("app=web")).await,
        ["canary", "web"]
    );
    assert_eq!(
        list(shop.clone(), lp().labels("app==web")).await,
        ["canary", "web"]
    );
    assert_eq!(
        list(shop.clone(), lp().labels("tier in (front,back),!canary")).await,
        ["api", "web"]
    );
    assert_eq!(
        list(shop.clone(), lp().labels("env notin (prod)")).await,
        ["api"]
    );
    assert_eq!(
        list(shop.clone(), lp().labels("env!=staging,canary")).await,
        ["canary"]
    );
    let sel = Expression::In("tier".into(), ["back".into()].into()).into();
    assert_eq!(list(shop.clone(), lp().labels_from(&sel)).await, ["api"]);
    assert_eq!(list(all.clone(), lp().labels("app=web")).await.len(), 3);
    assert_eq!(
        list(all.clone(), lp().fields("metadata.name=web"))
            .await
            .len(),
        2
    );
    assert_eq!(
        list(all.clone(), lp().fields("metadata.namespace=other")).await,
        ["web"]
    );

    let mut stream = watcher(shop, watcher::Config::default().labels("app=web")).boxed();
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::Init
    ));
    let mut initial = Vec::new();
    loop {
        match next(&mut stream).await.unwrap() {
            watcher::Event::InitApply(d) => initial.push(d.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["canary", "web"]);

    // Not matching: no event. Stops matching: Delete. Starts matching: Apply.
    fake.put(deployment(
        "shop",
        "api",
        json!({"app": "api", "touched": "1"}),
        2,
    ));
    fake.put(deployment(
        "other",
        "web",
        json!({"app": "web", "touched": "1"}),
        2,
    ));
    fake.put(deployment("shop", "web", json!({"app": "old"}), 1));
    match next(&mut stream).await.unwrap() {
        watcher::Event::Delete(d) => assert_eq!(d.name_any(), "web"),
        other => panic!("unexpected {other:?}"),
    }
    fake.put(deployment("shop", "api", json!({"app": "web"}), 2));
    match next(&mut stream).await.unwrap() {
        watcher::Event::Apply(d) => assert_eq!(d.name_any(), "api"),
        other => panic!("unexpected {other:?}"),
    }

    // Single-object watch via fieldSelector, as watch_object uses.
    let one: Api<Deployment> = Api::namespaced(fake.client(), "shop");
    let mut single = kube::runtime::watcher::watch_object(one, "canary").boxed();
    let first = next(&mut single).await.unwrap();
    assert_eq!(first.unwrap().name_any(), "canary");
    fake.remove("apps/v1", "Deployment", Some("shop"), "canary");
    assert!(next(&mut single).await.unwrap().is_none());
}

#[tokio::test]
async fn set_unavailable_makes_the_client_fail() {
    let fake = FakeApi::start().await;
    let api: Api<Namespace> = Api::all(fake.client());
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::Init
    ));
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        watcher::Event::InitDone
    ));

    fake.set_unavailable(true);
    let res = timeout(WAIT, api.list(&ListParams::default()))
        .await
        .expect("fails fast");
    assert_eq!(api_code(res), (503, "ServiceUnavailable".into()));
    let res = timeout(
        WAIT,
        api.create(&PostParams::default(), &typed(namespace("x", json!({})))),
    )
    .await
    .expect("fails fast");
    assert_eq!(api_code(res).0, 503);
    assert!(fake.list("v1", "Namespace").is_empty());

    // The open watch is cut; the watcher's reconnect fails.
    assert!(next(&mut stream).await.is_err());

    fake.set_unavailable(false);
    fake.put(namespace("after", json!({})));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ev = timeout(deadline - Instant::now(), stream.next())
            .await
            .expect("watcher recovers")
            .expect("stream continues");
        match ev {
            Ok(watcher::Event::Apply(ns) | watcher::Event::InitApply(ns)) => {
                assert_eq!(ns.name_any(), "after");
                break;
            }
            _ => continue,
        }
    }
    assert!(api.get("after").await.is_ok());
}

#[tokio::test]
async fn two_instances_are_independent() {
    let a = FakeApi::start().await;
    let b = FakeApi::start().await;
    assert_ne!(a.url(), b.url());
    let api_a: Api<Namespace> = Api::all(a.client());
    let api_b: Api<Namespace> = Api::all(b.client());

    a.put(namespace("only-a", json!({})));
    api_b
        .create(
            &PostParams::default(),
            &typed(namespace("only-b", json!({}))),
        )
        .await
        .unwrap();
    assert_eq!(
        names(&api_a.list(&ListParams::default()).await.unwrap().items),
        ["only-a"]
    );
    assert_eq!(
        names(&api_b.list(&ListParams::default()).await.unwrap().items),
        ["only-b"]
    );
    assert!(a.get("v1", "Namespace", None, "only-b").is_none());
    assert!(b.get("v1", "Namespace", None, "only-a").is_none());

    let same = typed::<Namespace>(namespace("same", json!({})));
    let in_a = api_a.create(&PostParams::default(), &same).await.unwrap();
    let in_b = api_b.create(&PostParams::default(), &same).await.unwrap();
    assert_ne!(in_a.metadata.uid, in_b.metadata.uid);

    assert_eq!(a.writes(), ["POST /api/v1/namespaces"]);
    assert_eq!(b.writes().len(), 2);

    a.set_unavailable(true);
    assert_eq!(api_code(api_a.get("same").await).0, 503);
    assert!(api_b.get("same").await.is_ok());
}
