//! Feeding the caches from a cluster with kube-rs watches.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use crate::resources::move_window::MoveWindow;
use crate::rules::sync_finalizer::NamespaceMeta;
use crate::state::windows::DeploymentMeta;
use crate::state::{State, WatchHealth};

const WATCH_TIMEOUT_SECS: u32 = 55;

/// Run one watch until the process ends, handing every event to `on_event`.
///
/// After an error the watch starts over with a fresh list (after a backoff, 0.5 s doubling to
/// 30 s): a relist is the only event that proves the cache is current again, since a watch
/// that resumes quietly says nothing. Until then `health` records the failure and the caches
/// keep their last view; `State` stops trusting it after `stale_after`.
pub(crate) async fn run<K>(
    api: Api<K>,
    what: &'static str,
    health: &WatchHealth,
    on_event: impl Fn(Event<K>),
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut backoff = Duration::from_millis(500);
    loop {
        // The API server ends each watch after `WATCH_TIMEOUT_SECS`, and kube-runtime gives up on
        // a connection that stays silent a little past that: a dead connection is replaced
        // within about a minute instead of five (decisions never wait for that: see
        // `State::namespace`).
        let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
        let mut events = watcher::watcher(api.clone(), config).boxed();
        while let Some(ev) = events.next().await {
            match ev {
                Ok(Event::InitDone) => {
                    health.ok();
                    backoff = Duration::from_millis(500);
                    on_event(Event::InitDone);
                    tracing::info!(watch = what, "cache synced");
                }
                Ok(e) => on_event(e),
                Err(e) => {
                    health.failed(&e.to_string());
                    tracing::warn!(watch = what, error = %e, retry_in = ?backoff, "watch failed; will list again");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// Namespaces, metadata only: the guard reads annotations, and the API server sends far less.
pub async fn watch_namespaces(client: kube::Client, state: Arc<State>) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let meta = |o: &PartialObjectMeta<Namespace>| {
        NamespaceMeta::from_annotations(o.metadata.annotations.as_ref(), &state.ids)
    };
    let name = |o: &PartialObjectMeta<Namespace>| o.metadata.name.clone().unwrap_or_default();
    let cache = &state.namespaces;
    // Every event proves the view current (a finished listing proves itself, in
    // `end_relist`); a part of a listing still under way proves nothing yet.
    run(
        api,
        "namespaces",
        &state.watches.namespaces,
        |ev| match ev {
            Event::Init => cache.begin_relist(),
            Event::InitApply(o) => cache.relist_apply(&name(&o), meta(&o)),
            Event::InitDone => cache.end_relist(),
            Event::Apply(o) => {
                cache.upsert(&name(&o), meta(&o));
                cache.prove();
            }
            Event::Delete(o) => {
                cache.remove(o.metadata.name.as_deref().unwrap_or_default());
                cache.prove();
            }
        },
    )
    .await
}

/// MoveWindows: the pin's on/off switch.
pub async fn watch_windows(client: kube::Client, state: Arc<State>) {
    let api: Api<MoveWindow> = Api::all(client);
    let cache = &state.windows;
    run(api, "movewindows", &state.watches.windows, |ev| match ev {
        Event::Init => cache.begin_relist(),
        Event::InitApply(w) => cache.relist_apply(&w),
        Event::InitDone => cache.end_relist(),
        Event::Apply(w) => cache.upsert(&w),
        Event::Delete(w) => cache.remove(w.metadata.name.as_deref().unwrap_or_default()),
    })
    .await
}

/// Deployments, metadata only: labels say whether a window selects the parent of a scale
/// request, and the annotation says what it will be restored to.
pub async fn watch_deployments(client: kube::Client, state: Arc<State>) {
    let api: Api<PartialObjectMeta<Deployment>> = Api::all(client);
    let cache = &state.deployments;
    let parts = |d: &PartialObjectMeta<Deployment>| {
        (
            d.metadata.namespace.clone().unwrap_or_default(),
            d.metadata.name.clone().unwrap_or_default(),
            DeploymentMeta::new(d.metadata.labels.as_ref(), d.metadata.annotations.as_ref()),
        )
    };
    run(
        api,
        "deployments",
        &state.watches.deployments,
        |ev| match ev {
            Event::Init => cache.begin_relist(),
            Event::InitApply(d) => {
                let (ns, name, meta) = parts(&d);
                cache.relist_apply(&ns, &name, meta)
            }
            Event::InitDone => cache.end_relist(),
            Event::Apply(d) => {
                let (ns, name, meta) = parts(&d);
                cache.upsert(&ns, &name, meta)
            }
            Event::Delete(d) => cache.remove(
                d.metadata.namespace.as_deref().unwrap_or_default(),
                d.metadata.name.as_deref().unwrap_or_default(),
            ),
        },
    )
    .await
}

/// Start the watches of the webhooks served, and only those.
pub fn spawn_watches(
    tasks: &mut tokio::task::JoinSet<()>,
    client: kube::Client,
    state: Arc<State>,
) {
    if state.serving.guard {
        tasks.spawn(watch_namespaces(client.clone(), state.clone()));
    }
    if state.serving.pin {
        tasks.spawn(watch_windows(client.clone(), state.clone()));
        tasks.spawn(watch_deployments(client, state));
    }
}
