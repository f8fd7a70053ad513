//! State the decisions read: caches fed by kube watches, or a folder of YAML files.

pub mod cluster;
pub mod files;
pub mod namespaces;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;

use crate::policy::identity::Identities;
use crate::policy::sync_finalizer::NamespaceMeta;
use namespaces::{CacheEntry, NamespaceCache};

/// What a decision learnt about a namespace; owned, so the request can hold it across awaits.
#[derive(Debug, Clone, PartialEq)]
pub enum NamespaceLookup {
    Relevant(Arc<NamespaceMeta>),
    /// Exists and carries nothing the guard reads, or does not exist.
    Plain,
    Unavailable(String),
}

/// Everything the webhooks read, shared by all requests.
pub struct State {
    pub ids: Identities,
    pub namespaces: NamespaceCache,
    /// Set when state comes from a cluster: asked once when the cache misses a namespace.
    pub namespace_api: Option<kube::Api<Namespace>>,
    /// How long a cache-miss fetch may take before the guard gives up and denies.
    pub api_timeout: Duration,
}

impl State {
    pub fn new(ids: Identities) -> Self {
        State {
            ids,
            namespaces: NamespaceCache::default(),
            namespace_api: None,
            api_timeout: Duration::from_secs(3),
        }
    }

    /// State from a folder of YAML manifests. Kinds it does not read are an error, so that a
    /// typo in `kind` does not silently leave a namespace unguarded.
    pub fn from_dir(dir: &Path, ids: Identities) -> anyhow::Result<Self> {
        let state = State::new(ids);
        let docs = files::load_dir(dir)?;
        let mut metas = Vec::new();
        for doc in &docs {
            match doc.kind.as_str() {
                "Namespace" => {
                    let ns: Namespace = doc.parse()?;
                    let name = ns.metadata.name.clone().unwrap_or_default();
                    if name.is_empty() {
                        anyhow::bail!("{}: Namespace has no metadata.name", doc.place());
                    }
                    metas.push(NamespaceMeta::from_annotations(
                        &name,
                        ns.metadata.annotations.as_ref(),
                        &state.ids,
                    ));
                }
                other => anyhow::bail!(
                    "{}: kind {other:?} is not one handoff reads from --state (Namespace)",
                    doc.place()
                ),
            }
        }
        state.namespaces.replace_all(metas);
        Ok(state)
    }

    /// The namespace as the guard needs it: from the cache, or asked of the API once.
    pub async fn namespace(&self, name: &str) -> NamespaceLookup {
        match self.namespaces.get(name) {
            CacheEntry::Relevant(m) => return NamespaceLookup::Relevant(m),
            CacheEntry::Plain => return NamespaceLookup::Plain,
            CacheEntry::Unknown => {}
        }
        let Some(api) = self.namespace_api.as_ref() else {
            return NamespaceLookup::Plain;
        };
        match tokio::time::timeout(self.api_timeout, api.get_metadata_opt(name)).await {
            Err(_) => NamespaceLookup::Unavailable(format!(
                "the API server did not answer within {:?}",
                self.api_timeout
            )),
            Ok(Err(e)) => NamespaceLookup::Unavailable(format!("the API server said: {e}")),
            Ok(Ok(None)) => NamespaceLookup::Plain,
            Ok(Ok(Some(ns))) => {
                let meta = NamespaceMeta::from_annotations(
                    name,
                    ns.metadata.annotations.as_ref(),
                    &self.ids,
                );
                self.namespaces.upsert(meta.clone());
                if meta.is_interesting() {
                    NamespaceLookup::Relevant(Arc::new(meta))
                } else {
                    NamespaceLookup::Plain
                }
            }
        }
    }

    pub fn is_synced(&self) -> bool {
        self.namespaces.is_synced()
    }
}
