//! Feeding the caches from a cluster with kube-rs watches.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};

use crate::policy::sync_finalizer::NamespaceMeta;
use crate::state::State;

/// Keep `state.namespaces` in step with the cluster until the process ends. A metadata-only
/// watch: the guard reads annotations only, and the API server sends far less.
pub async fn watch_namespaces(client: kube::Client, state: Arc<State>) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let cache = &state.namespaces;
    let meta = |o: &PartialObjectMeta<Namespace>| {
        NamespaceMeta::from_annotations(
            o.metadata.name.as_deref().unwrap_or_default(),
            o.metadata.annotations.as_ref(),
            &state.ids,
        )
    };
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => cache.begin_relist(),
            Ok(Event::InitApply(o)) => cache.relist_apply(meta(&o)),
            Ok(Event::InitDone) => {
                cache.end_relist();
                tracing::info!(namespaces = cache.len(), "namespace cache synced");
            }
            Ok(Event::Apply(o)) => cache.upsert(meta(&o)),
            Ok(Event::Delete(o)) => cache.remove(o.metadata.name.as_deref().unwrap_or_default()),
            Err(e) => tracing::warn!(error = %e, "namespace watch failed; retrying with backoff"),
        }
    }
}
