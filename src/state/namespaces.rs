//! The namespace cache the guard reads while a request waits.
//!
//! It keeps every namespace's name (so that a miss really means "not seen yet") but only the
//! few annotations the guard reads, and shares nothing with the watch's buffers: at 100,000
//! namespaces it costs a few MiB, where a reflector store of whole `ObjectMeta`s costs tens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use crate::policy::sync_finalizer::NamespaceMeta;

type Entries = HashMap<Box<str>, Option<Arc<NamespaceMeta>>>;

#[derive(Default)]
struct Inner {
    entries: Entries,
    /// Filled during a relist, swapped in whole when it ends, so a relist never shows a
    /// half-empty cache to a request.
    relist: Option<Entries>,
}

/// The guard's view of namespaces: name → what matters in its metadata.
#[derive(Default)]
pub struct NamespaceCache {
    inner: RwLock<Inner>,
    synced: AtomicBool,
    /// When the watch last proved itself current (an event arrived), in milliseconds after
    /// `EPOCH` plus one; 0 = never.
    proven: AtomicU64,
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// What the cache knows of one namespace.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheEntry {
    /// Not in the cache: never seen, or created since the last event.
    Unknown,
    /// Present, and carrying nothing the guard reads.
    Plain,
    Relevant(Arc<NamespaceMeta>),
}

fn entry(meta: NamespaceMeta) -> Option<Arc<NamespaceMeta>> {
    meta.is_interesting().then(|| Arc::new(meta))
}

impl NamespaceCache {
    /// The watch delivered something: the view is current as of now. A silently dead watch
    /// connection looks exactly like a quiet cluster, so only this counts as proof.
    pub fn prove(&self) {
        let ms = EPOCH.elapsed().as_millis() as u64 + 1;
        self.proven.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long ago the view was last proven current (`None`: never).
    pub fn proven_ago(&self) -> Option<Duration> {
        match self.proven.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                EPOCH
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1)),
            ),
        }
    }

    pub fn get(&self, name: &str) -> CacheEntry {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        match inner.entries.get(name) {
            None => CacheEntry::Unknown,
            Some(None) => CacheEntry::Plain,
            Some(Some(m)) => CacheEntry::Relevant(m.clone()),
        }
    }

    pub fn upsert(&self, meta: NamespaceMeta) {
        let name: Box<str> = meta.name.as_str().into();
        let value = entry(meta);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.entries.insert(name, value);
    }

    /// Insert unless the cache already has an entry (a fetch must not undo a newer event).
    pub fn insert_if_absent(&self, meta: NamespaceMeta) {
        let name: Box<str> = meta.name.as_str().into();
        let value = entry(meta);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.entries.entry(name).or_insert(value);
    }

    pub fn remove(&self, name: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.entries.remove(name);
    }

    /// A watch (re)started: collect the listing aside.
    pub fn begin_relist(&self) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.relist = Some(HashMap::new());
    }

    pub fn relist_apply(&self, meta: NamespaceMeta) {
        let name: Box<str> = meta.name.as_str().into();
        let value = entry(meta);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match inner.relist.as_mut() {
            Some(buf) => {
                buf.insert(name, value);
            }
            None => {
                inner.entries.insert(name, value);
            }
        }
    }

    /// The listing is complete: it replaces the cache, and the cache counts as synced.
    pub fn end_relist(&self) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(mut buf) = inner.relist.take() {
            buf.shrink_to_fit();
            inner.entries = buf;
        }
        drop(inner);
        self.synced.store(true, Ordering::Release);
    }

    /// Replace everything at once (state from files).
    pub fn replace_all(&self, metas: impl IntoIterator<Item = NamespaceMeta>) {
        self.begin_relist();
        for m in metas {
            self.relist_apply(m);
        }
        self.end_relist();
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
