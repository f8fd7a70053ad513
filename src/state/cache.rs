//! The one cache every watch feeds: what handoff keeps of one kind of object, by key.
//!
//! Written once for namespaces, MoveWindows and Deployments alike: a relist updates it in place
//! and sweeps out what it did not list (a request never sees a half-empty cache), events update it, a
//! read on a miss fills it in without undoing a newer event, and the watch marks when it last
//! proved the view current (docs/ARCHITECTURE.md §1.3: a silently dead watch looks like a quiet cluster).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, RwLock};
use std::time::{Duration, Instant};

struct Inner<K, V> {
    entries: HashMap<K, Slot<V>>,
    /// The generation a relist in progress stamps on what it lists; `None` outside a relist.
    relisting: Option<u32>,
    generation: u32,
}

struct Slot<V> {
    value: V,
    generation: u32,
}

/// A projection of one kind of object: key → what the decisions read of it.
pub struct Projected<K, V> {
    inner: RwLock<Inner<K, V>>,
    synced: AtomicBool,
    /// When the watch last proved the view current, in milliseconds after `EPOCH` plus one;
    /// 0 = never.
    proven: AtomicU64,
    /// Counts removals and relists: a read that began before one may hold an object that is
    /// gone, and must not put it back (`insert_if_unchanged_since`).
    removals: AtomicU64,
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

impl<K, V> Default for Projected<K, V> {
    fn default() -> Self {
        Projected {
            inner: RwLock::new(Inner {
                entries: HashMap::new(),
                relisting: None,
                generation: 0,
            }),
            synced: AtomicBool::new(false),
            proven: AtomicU64::new(0),
            removals: AtomicU64::new(0),
        }
    }
}

impl<K: Hash + Eq, V: Clone> Projected<K, V> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner<K, V>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner<K, V>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read().entries.get(key).map(|s| s.value.clone())
    }

    pub fn upsert(&self, key: K, value: V) {
        let mut inner = self.write();
        let generation = inner.generation;
        inner.entries.insert(key, Slot { value, generation });
    }

    /// Insert unless the cache already has an entry: a read must not undo a newer event.
    pub fn insert_if_absent(&self, key: K, value: V) {
        let mut inner = self.write();
        let generation = inner.generation;
        inner
            .entries
            .entry(key)
            .or_insert(Slot { value, generation });
    }

    pub fn remove<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut inner = self.write();
        inner.entries.remove(key);
        self.removals.fetch_add(1, Ordering::AcqRel);
    }

    /// Taken before a read of the API server whose answer is to be cached.
    pub fn removal_epoch(&self) -> u64 {
        self.removals.load(Ordering::Acquire)
    }

    /// `insert_if_absent` for the answer of a read that began at `epoch`: skipped if anything
    /// was removed or relisted since, because the answer may be older than that news (a
    /// namespace deleted meanwhile must not come back). Rare, and the read's answer still
    /// serves the request that made it.
    pub fn insert_if_unchanged_since(&self, epoch: u64, key: K, value: V) {
        let mut inner = self.write();
        if self.removals.load(Ordering::Acquire) != epoch {
            return;
        }
        let generation = inner.generation;
        inner
            .entries
            .entry(key)
            .or_insert(Slot { value, generation });
    }

    /// A watch (re)started and lists everything again. The listing updates the cache in place
    /// and what it did not list is swept out when it ends: a request never sees a half-empty
    /// cache (every entry is the old view or a newer one), and a relist costs no second copy
    /// of the cache (memory grows with namespaces, not with relists: BENCHMARKS.md).
    pub fn begin_relist(&self) {
        let mut inner = self.write();
        inner.generation = inner.generation.wrapping_add(1);
        inner.relisting = Some(inner.generation);
        self.removals.fetch_add(1, Ordering::AcqRel);
    }

    pub fn relist_apply(&self, key: K, value: V) {
        self.upsert(key, value);
    }

    /// The listing is complete: what it did not list is gone, and the cache counts as synced
    /// and current.
    pub fn end_relist(&self) {
        let mut inner = self.write();
        if let Some(generation) = inner.relisting.take() {
            inner.entries.retain(|_, s| s.generation == generation);
            inner.entries.shrink_to_fit();
        }
        drop(inner);
        self.synced.store(true, Ordering::Release);
        self.prove();
        release_freed_memory();
    }

    /// Replace everything at once (state from files).
    pub fn replace_all(&self, entries: impl IntoIterator<Item = (K, V)>) {
        self.begin_relist();
        for (k, v) in entries {
            self.relist_apply(k, v);
        }
        self.end_relist();
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn len(&self) -> usize {
        self.read().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Read every value under one lock (metrics, snapshots).
    pub fn fold<R>(&self, init: R, mut f: impl FnMut(R, (&K, &V)) -> R) -> R {
        self.read()
            .entries
            .iter()
            .fold(init, |acc, (k, s)| f(acc, (k, &s.value)))
    }

    /// The watch delivered something: the view is current as of now.
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
}

/// Give the memory a large listing freed back to the system. glibc keeps freed chunks of the
/// list's pages (JSON, decoded objects) in its arenas, interleaved with the cache's long-lived
/// entries; at 100,000 namespaces that is several MiB of RSS nothing uses. Once per relist.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_arrives_during_a_relist_survives_its_sweep_and_relists_repeat() {
        let c: Projected<Box<str>, u32> = Projected::default();
        c.replace_all([("a".into(), 1), ("gone".into(), 2)]);
        c.begin_relist();
        c.relist_apply("a".into(), 10);
        // A read on a miss and an event during the listing are newer than the list's start.
        c.insert_if_absent("read".into(), 3);
        c.upsert("event".into(), 4);
        c.end_relist();
        let mut keys: Vec<Box<str>> = c.fold(Vec::new(), |mut v, (k, _)| {
            v.push(k.clone());
            v
        });
        keys.sort();
        assert_eq!(keys, ["a", "event", "read"].map(Box::from));
        // An interrupted relist followed by a whole one: only the last listing counts.
        c.begin_relist();
        c.relist_apply("half".into(), 5);
        c.begin_relist();
        c.relist_apply("a".into(), 11);
        c.end_relist();
        assert_eq!((c.get("a"), c.get("half"), c.len()), (Some(11), None, 1));
    }

    #[test]
    fn a_read_older_than_a_removal_does_not_bring_the_object_back() {
        let c: Projected<Box<str>, u32> = Projected::default();
        c.upsert("ns".into(), 1);
        let epoch = c.removal_epoch();
        // The read is under way when the watch says the namespace is gone.
        c.remove("ns");
        c.insert_if_unchanged_since(epoch, "ns".into(), 1);
        assert_eq!(c.get("ns"), None);
        // A read that began after it is cached.
        let epoch = c.removal_epoch();
        c.insert_if_unchanged_since(epoch, "other".into(), 2);
        assert_eq!(c.get("other"), Some(2));
        // A relist in between counts as news too.
        let epoch = c.removal_epoch();
        c.begin_relist();
        c.insert_if_unchanged_since(epoch, "late".into(), 3);
        c.end_relist();
        assert_eq!(c.get("late"), None);
    }

    #[test]
    fn relist_sweeps_what_it_did_not_list_marks_synced_and_proves() {
        let c: Projected<Box<str>, u32> = Projected::default();
        assert!(!c.is_synced());
        assert_eq!(c.proven_ago(), None);
        c.upsert("old".into(), 1);
        c.upsert("a".into(), 0);
        c.begin_relist();
        c.relist_apply("a".into(), 2);
        // During the relist every entry is the old view or a newer one, never missing.
        assert_eq!(
            (c.get("old"), c.get("a"), c.get("b")),
            (Some(1), Some(2), None)
        );
        c.relist_apply("b".into(), 3);
        c.end_relist();
        assert!(c.is_synced());
        assert!(c.proven_ago().is_some());
        assert_eq!(c.get("old"), None);
        assert_eq!((c.get("a"), c.get("b"), c.len()), (Some(2), Some(3), 2));
        // A read on a miss never undoes what an event put there.
        c.insert_if_absent("a".into(), 9);
        c.insert_if_absent("c".into(), 4);
        assert_eq!((c.get("a"), c.get("c")), (Some(2), Some(4)));
        c.remove("a");
        assert_eq!(c.get("a"), None);
        assert_eq!(c.fold(0, |n, (_, v)| n + v), 7);
    }
}
