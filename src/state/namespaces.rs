//! The namespace cache the guard reads while a request waits.
//!
//! It keeps every namespace's name (so that a miss really means "not seen yet") but only the
//! few annotations the guard reads, and shares nothing with the watch's buffers: at 100,000
//! namespaces it costs a few MiB, where a reflector store of whole `ObjectMeta`s costs tens.

use std::time::Duration;

use super::cache::Projected;
use crate::rules::sync_finalizer::NamespaceMeta;

/// The guard's view of namespaces: name → what matters in its metadata (both parts `None`:
/// nothing, which costs only the name).
#[derive(Default)]
pub struct NamespaceCache(Projected<NamespaceName, NamespaceMeta>);

/// A namespace name kept in the table itself when it is short (kcp's are `kcp-` and 12
/// characters): no allocation of its own, so 100,000 names cost no 100,000 small heap blocks
/// (and none of the fragmentation they leave between a listing's freed buffers).
#[derive(Clone)]
pub enum NamespaceName {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

const INLINE: usize = 22;

impl NamespaceName {
    pub fn as_str(&self) -> &str {
        match self {
            NamespaceName::Inline { len, bytes } => {
                // Only ever built from a whole `&str` of `len` bytes (see `From`).
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            NamespaceName::Heap(s) => s,
        }
    }
}

impl From<&str> for NamespaceName {
    fn from(s: &str) -> Self {
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            NamespaceName::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            NamespaceName::Heap(s.into())
        }
    }
}

impl std::borrow::Borrow<str> for NamespaceName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

// Hash and equality are the name's, as `Borrow<str>` requires for lookups by `&str`.
impl std::hash::Hash for NamespaceName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialEq for NamespaceName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for NamespaceName {}

/// What the cache knows of one namespace.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheEntry {
    /// Not in the cache: never seen, or created since the last event.
    Unknown,
    /// Present, and carrying nothing the guard reads.
    Plain,
    Relevant(NamespaceMeta),
}

impl NamespaceCache {
    pub fn get(&self, name: &str) -> CacheEntry {
        match self.0.get(name) {
            None => CacheEntry::Unknown,
            Some(m) if !m.is_interesting() => CacheEntry::Plain,
            Some(m) => CacheEntry::Relevant(m),
        }
    }

    pub fn upsert(&self, name: &str, meta: NamespaceMeta) {
        self.0.upsert(name.into(), meta);
    }

    /// Insert unless the cache already has an entry (a read must not undo a newer event).
    pub fn insert_if_absent(&self, name: &str, meta: NamespaceMeta) {
        self.0.insert_if_absent(name.into(), meta);
    }

    /// Taken before a read whose answer `insert_read` will cache.
    pub fn removal_epoch(&self) -> u64 {
        self.0.removal_epoch()
    }

    /// Cache a read's answer, unless the cache already has the namespace or something was
    /// removed or relisted since the read began (its answer may predate a delete).
    pub fn insert_read(&self, epoch: u64, name: &str, meta: NamespaceMeta) {
        self.0.insert_if_unchanged_since(epoch, name.into(), meta);
    }

    pub fn remove(&self, name: &str) {
        self.0.remove(name);
    }

    pub fn begin_relist(&self) {
        self.0.begin_relist();
    }

    pub fn relist_apply(&self, name: &str, meta: NamespaceMeta) {
        self.0.relist_apply(name.into(), meta);
    }

    pub fn end_relist(&self) {
        self.0.end_relist();
    }

    /// Replace everything at once (state from files).
    pub fn replace_all<'a>(&self, metas: impl IntoIterator<Item = (&'a str, NamespaceMeta)>) {
        self.0
            .replace_all(metas.into_iter().map(|(n, m)| (NamespaceName::from(n), m)));
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

    /// Every namespace whose locator names a kcp namespace: `(name, kcp namespace, whether it
    /// carries a blocking sync finalizer itself)`. For the mirror; kept only when handoff reads
    /// kcp.
    pub fn located_in_kcp(&self) -> Vec<(String, crate::rules::identity::KcpNamespace, bool)> {
        self.0.fold(Vec::new(), |mut out, (name, meta)| {
            if let Some(Ok(at)) = meta.kcp.as_deref() {
                out.push((
                    name.as_str().to_string(),
                    at.clone(),
                    meta.finalizers.is_some(),
                ));
            }
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::rules::identity::Identities;

    fn annotations(namespace: &str, held: bool) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(
            "kcp.io/namespace-locator".to_string(),
            format!(
                r#"{{"syncTarget":{{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"}},"cluster":"root:org:ws","namespace":"{namespace}"}}"#
            ),
        )]);
        if held {
            a.insert(
                "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g".into(),
                "glbc".into(),
            );
        }
        a
    }

    #[test]
    fn short_names_live_in_the_table_and_long_ones_on_the_heap_alike() {
        let c = NamespaceCache::default();
        let long = "a-namespace-name-longer-than-twenty-two-bytes";
        for name in ["", "kcp-33jbiactwhg0", "exactly-22-bytes-long!", long] {
            c.upsert(name, NamespaceMeta::default());
            assert_eq!(c.get(name), CacheEntry::Plain, "{name:?}");
            assert_eq!(NamespaceName::from(name).as_str(), name);
        }
        assert!(matches!(
            NamespaceName::from("kcp-33jbiactwhg0"),
            NamespaceName::Inline { .. }
        ));
        assert!(matches!(NamespaceName::from(long), NamespaceName::Heap(_)));
        assert_eq!(c.get("kcp-33jbiactwhg"), CacheEntry::Unknown);
        c.remove(long);
        assert_eq!((c.get(long), c.len()), (CacheEntry::Unknown, 3));
    }

    #[test]
    fn relist_updates_in_place_and_sweeps_what_it_did_not_list() {
        let ids = Identities::default();
        let meta = |held| NamespaceMeta::from_annotations(Some(&annotations("x", held)), &ids);
        let c = NamespaceCache::default();
        assert!(!c.is_synced());
        c.upsert("old", meta(true));
        c.begin_relist();
        c.relist_apply("a", meta(true));
        c.relist_apply("b", NamespaceMeta::default());
        // During the relist the old view still answers.
        assert!(matches!(c.get("old"), CacheEntry::Relevant(_)));
        c.end_relist();
        assert!(c.is_synced());
        assert_eq!(c.get("old"), CacheEntry::Unknown);
        assert!(matches!(c.get("a"), CacheEntry::Relevant(_)));
        assert_eq!(c.get("b"), CacheEntry::Plain);
        assert_eq!(c.len(), 2);
        c.upsert("a", NamespaceMeta::default());
        assert_eq!(c.get("a"), CacheEntry::Plain);
        c.remove("a");
        assert_eq!(c.get("a"), CacheEntry::Unknown);
    }

    /// A physical cluster under kcp: thousands of namespaces, a handful of sync targets. Each
    /// sync target is kept (and hashed) once, however many namespaces name it.
    #[test]
    fn ten_thousand_namespaces_of_one_sync_target_share_a_single_identity() {
        let ids = Identities::default();
        let c = NamespaceCache::default();
        c.begin_relist();
        for i in 0..10_000 {
            let meta = NamespaceMeta::from_annotations(
                Some(&annotations(&format!("ns-{i}"), i % 10 == 0)),
                &ids,
            );
            c.relist_apply(&format!("kcp-{i}"), meta);
        }
        c.end_relist();
        let located = |name: &str| match c.get(name) {
            CacheEntry::Relevant(m) => m.located.expect("located"),
            other => panic!("{name}: {other:?}"),
        };
        let first = located("kcp-0");
        for i in 0..10_000 {
            assert!(
                Arc::ptr_eq(&first, &located(&format!("kcp-{i}"))),
                "kcp-{i}"
            );
        }
        // The cache's 10,000 references and `first`: nothing else holds one.
        assert_eq!(Arc::strong_count(&first), 10_001);
        // Only the held tenth carries finalizers of its own.
        let held = (0..10_000)
            .filter(|i| matches!(c.get(&format!("kcp-{i}")), CacheEntry::Relevant(m) if m.finalizers.is_some()))
            .count();
        assert_eq!(held, 1_000);
    }
}
