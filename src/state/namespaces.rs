//! The namespace cache the guard reads while a request waits.
//!
//! It keeps every namespace's name (so that a miss really means "not seen yet") but only the
//! few annotations the guard reads, and shares nothing with the watch's buffers: at 100,000
//! namespaces it costs a few MiB, where a reflector store of whole `ObjectMeta`s costs tens.

use std::sync::Arc;
use std::time::Duration;

use super::cache::Projected;
use crate::policy::sync_finalizer::NamespaceMeta;

/// The guard's view of namespaces: name → what matters in its metadata (`None`: nothing).
#[derive(Default)]
pub struct NamespaceCache(Projected<Box<str>, Option<Arc<NamespaceMeta>>>);

/// What the cache knows of one namespace.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheEntry {
    /// Not in the cache: never seen, or created since the last event.
    Unknown,
    /// Present, and carrying nothing the guard reads.
    Plain,
    Relevant(Arc<NamespaceMeta>),
}

fn entry(meta: NamespaceMeta) -> (Box<str>, Option<Arc<NamespaceMeta>>) {
    let name: Box<str> = meta.name.as_str().into();
    (name, meta.is_interesting().then(|| Arc::new(meta)))
}

impl NamespaceCache {
    pub fn get(&self, name: &str) -> CacheEntry {
        match self.0.get(name) {
            None => CacheEntry::Unknown,
            Some(None) => CacheEntry::Plain,
            Some(Some(m)) => CacheEntry::Relevant(m),
        }
    }

    pub fn upsert(&self, meta: NamespaceMeta) {
        let (k, v) = entry(meta);
        self.0.upsert(k, v);
    }

    /// Insert unless the cache already has an entry (a read must not undo a newer event).
    pub fn insert_if_absent(&self, meta: NamespaceMeta) {
        let (k, v) = entry(meta);
        self.0.insert_if_absent(k, v);
    }

    pub fn remove(&self, name: &str) {
        self.0.remove(name);
    }

    pub fn begin_relist(&self) {
        self.0.begin_relist();
    }

    pub fn relist_apply(&self, meta: NamespaceMeta) {
        let (k, v) = entry(meta);
        self.0.relist_apply(k, v);
    }

    pub fn end_relist(&self) {
        self.0.end_relist();
    }

    /// Replace everything at once (state from files).
    pub fn replace_all(&self, metas: impl IntoIterator<Item = NamespaceMeta>) {
        self.0.replace_all(metas.into_iter().map(entry));
    }

    pub fn is_synced(&self) -> bool {
        self.0.is_synced()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The watch delivered something: the view is current as of now.
    pub fn prove(&self) {
        self.0.prove();
    }

    pub fn proven_ago(&self) -> Option<Duration> {
        self.0.proven_ago()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::sync_finalizer::SoftFinalizer;

    fn meta(name: &str, held: bool) -> NamespaceMeta {
        NamespaceMeta {
            name: name.to_string(),
            finalizers: if held {
                vec![SoftFinalizer {
                    annotation: "finalizers.workload.kcp.io/K".into(),
                    key: "K".into(),
                    value: "x".into(),
                }]
            } else {
                vec![]
            },
            located: None,
        }
    }

    #[test]
    fn relist_swaps_whole_and_marks_synced() {
        let c = NamespaceCache::default();
        assert!(!c.is_synced());
        c.upsert(meta("old", true));
        c.begin_relist();
        c.relist_apply(meta("a", true));
        c.relist_apply(meta("b", false));
        // During the relist the old view still answers.
        assert!(matches!(c.get("old"), CacheEntry::Relevant(_)));
        assert_eq!(c.get("a"), CacheEntry::Unknown);
        c.end_relist();
        assert!(c.is_synced());
        assert_eq!(c.get("old"), CacheEntry::Unknown);
        assert!(matches!(c.get("a"), CacheEntry::Relevant(_)));
        assert_eq!(c.get("b"), CacheEntry::Plain);
        assert_eq!(c.len(), 2);
        c.upsert(meta("a", false));
        assert_eq!(c.get("a"), CacheEntry::Plain);
        c.remove("a");
        assert_eq!(c.get("a"), CacheEntry::Unknown);
    }
}
