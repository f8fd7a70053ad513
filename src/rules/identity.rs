//! Who is asking: username → sync target. The kcp hashes live here and nowhere else.
//!
//! kcp derives two identifiers from SHA-224 digests:
//! - the `syncTargetKey`, base62 (Go's `big.Int.Text(62)`) of SHA-224 of `"<cluster>:<name>"`
//!   (kcp v0.7–v0.10 hashed `"<cluster><name>"`), which names soft-finalizer annotations;
//! - the syncer's id, the first 8 characters of base36 of SHA-224 of the SyncTarget's UID, which
//!   names the syncer's ServiceAccount `kcp-syncer-<name>-<id>`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use serde::Deserialize;
use sha2::{Digest, Sha224};

/// `finalizers.workload.<domain>/<SyncTargetKey>` names a soft finalizer for that sync target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyncTargetKey(pub String);

impl fmt::Display for SyncTargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the key's hash input is formed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KeyScheme {
    /// `"<cluster>:<name>"`, kcp since v0.11.
    Current,
    /// `"<cluster><name>"`, kcp v0.7–v0.10.
    Legacy,
}

const BASE62: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Big-endian unsigned integer to digits in `alphabet`, no padding: Go's `big.Int.Text(base)`.
///
/// Long division in 32-bit limbs by the largest power of the base that fits a limb, so a
/// 224-bit digest takes a few dozen divisions (it runs on every syncer DELETE, three times);
/// the two bases kcp uses get divisions by constants, which compile to multiplications.
fn big_endian_to_base(bytes: &[u8], alphabet: &[u8]) -> String {
    match alphabet.len() {
        62 => to_base(bytes, alphabet, 62),
        36 => to_base(bytes, alphabet, 36),
        n => to_base(bytes, alphabet, n as u64),
    }
}

#[inline(always)]
fn to_base(bytes: &[u8], alphabet: &[u8], base: u64) -> String {
    debug_assert_eq!(alphabet.len() as u64, base);
    let (chunk, per_chunk) = {
        let (mut c, mut k) = (base, 1);
        while c * base <= u64::from(u32::MAX) {
            c *= base;
            k += 1;
        }
        (c, k)
    };
    let head = bytes.len() % 4;
    let mut limbs: Vec<u32> = Vec::with_capacity(bytes.len() / 4 + 1);
    if head > 0 {
        limbs.push(
            bytes[..head]
                .iter()
                .fold(0, |a, b| (a << 8) | u32::from(*b)),
        );
    }
    limbs.extend(
        bytes[head..]
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])),
    );
    let zeros = limbs.iter().take_while(|l| **l == 0).count();
    limbs.drain(..zeros);
    let mut digits = Vec::with_capacity(bytes.len() * 2);
    while !limbs.is_empty() {
        let mut rem: u64 = 0;
        for l in limbs.iter_mut() {
            let acc = (rem << 32) | u64::from(*l);
            *l = (acc / chunk) as u32;
            rem = acc % chunk;
        }
        let zeros = limbs.iter().take_while(|l| **l == 0).count();
        limbs.drain(..zeros);
        // A full chunk of digits, zeros included, unless this was the most significant one.
        for _ in 0..per_chunk {
            if limbs.is_empty() && rem == 0 {
                break;
            }
            digits.push(alphabet[(rem % base) as usize]);
            rem /= base;
        }
    }
    if digits.is_empty() {
        digits.push(alphabet[0]);
    }
    digits.reverse();
    String::from_utf8(digits).expect("alphabet is ASCII")
}

/// The `syncTargetKey` kcp computes for a SyncTarget `name` in logical cluster `cluster`.
pub fn sync_target_key(cluster: &str, name: &str, scheme: KeyScheme) -> SyncTargetKey {
    let mut h = Sha224::new();
    h.update(cluster.as_bytes());
    if scheme == KeyScheme::Current {
        h.update(b":");
    }
    h.update(name.as_bytes());
    SyncTargetKey(big_endian_to_base(&h.finalize(), BASE62))
}

/// The 8-character id in the syncer's ServiceAccount name, from the SyncTarget's UID.
///
/// kcp writes it with `github.com/martinlindhe/base36`, which, unlike `big.Int.Text`, keeps one
/// `0` for every leading zero byte of the digest (about one UID in 256 has one).
pub fn syncer_id(sync_target_uid: &str) -> String {
    let digest = Sha224::digest(sync_target_uid.as_bytes());
    let zeros = digest.iter().take_while(|b| **b == 0).count();
    let mut s = "0".repeat(zeros);
    if zeros < digest.len() {
        s.push_str(&big_endian_to_base(&digest, &BASE62[..36]));
    }
    s.truncate(8);
    s
}

/// A username of the form `system:serviceaccount:<ns>:kcp-syncer-<name>-<id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncerServiceAccount<'a> {
    pub namespace: &'a str,
    pub sync_target_name: &'a str,
    pub id: &'a str,
}

pub fn parse_syncer_username(username: &str) -> Option<SyncerServiceAccount<'_>> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, sa) = rest.split_once(':')?;
    let rest = sa.strip_prefix("kcp-syncer-")?;
    let (name, id) = rest.rsplit_once('-')?;
    let id_ok = id.len() == 8
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
    if namespace.is_empty() || name.is_empty() || !id_ok {
        return None;
    }
    Some(SyncerServiceAccount {
        namespace,
        sync_target_name: name,
        id,
    })
}

/// The `<domain>/namespace-locator` annotation the syncer writes on namespaces it creates.
/// The legacy `kcp.dev` form says `workspace` where the current one says `cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceLocator {
    #[serde(default)]
    pub sync_target: Option<LocatorSyncTarget>,
    #[serde(default, alias = "workspace")]
    pub cluster: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// The kcp namespace a physical namespace stands for: namespace `namespace` in logical cluster
/// `cluster` (kcp's workspace), read at kcp's logical-cluster URL (`path`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KcpNamespace {
    pub cluster: String,
    pub namespace: String,
}

impl KcpNamespace {
    /// The namespace's URL path under kcp's base URL:
    /// `/clusters/<cluster>/api/v1/namespaces/<namespace>`. Both parts were checked to be plain
    /// names (`[a-z0-9-]`, and `:` between a cluster's segments), so nothing needs escaping and
    /// nothing can leave its path segment.
    pub fn path(&self) -> String {
        format!(
            "/clusters/{}/api/v1/namespaces/{}",
            self.cluster, self.namespace
        )
    }

    /// How a message names it.
    pub fn describe(&self) -> String {
        format!(
            "kcp namespace \"{}\" (workspace {})",
            self.namespace, self.cluster
        )
    }
}

impl fmt::Display for KcpNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.cluster, self.namespace)
    }
}

/// A DNS-1123 label, as Kubernetes requires of a namespace name.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A kcp logical cluster: a name or a workspace path, `:`-separated labels (`root:org:ws`,
/// `2x1lq9q8a6w0p5cw`).
fn is_logical_cluster(s: &str) -> bool {
    !s.is_empty() && s.len() <= 255 && s.split(':').all(is_dns_label)
}

/// Why a namespace locator names no kcp namespace handoff will read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KcpNamespaceError {
    #[error("the namespace locator names no logical cluster (cluster or workspace)")]
    NoCluster,
    #[error("the namespace locator names no kcp namespace")]
    NoNamespace,
    #[error("the namespace locator's logical cluster {0:?} is not a kcp logical cluster name")]
    Cluster(String),
    #[error("the namespace locator's namespace {0:?} is not a namespace name")]
    Namespace(String),
}

impl NamespaceLocator {
    /// The kcp namespace this locator names: the top-level `cluster` (legacy `workspace`) and
    /// `namespace`. The sync target's own cluster is not a fallback: a SyncTarget may live in
    /// another workspace than the workloads it syncs, and reading the wrong namespace would
    /// find no hold where one is set. Anything that is not a plain name (a `/`, a `*`, `..`,
    /// a percent sign, upper case) is refused rather than escaped: a locator is an annotation
    /// anyone who may edit the namespace can write.
    pub fn kcp_namespace(&self) -> Result<KcpNamespace, KcpNamespaceError> {
        let cluster = self.cluster.as_deref().unwrap_or("");
        let namespace = self.namespace.as_deref().unwrap_or("");
        if cluster.is_empty() {
            return Err(KcpNamespaceError::NoCluster);
        }
        if namespace.is_empty() {
            return Err(KcpNamespaceError::NoNamespace);
        }
        if !is_logical_cluster(cluster) {
            return Err(KcpNamespaceError::Cluster(cluster.to_string()));
        }
        if !is_dns_label(namespace) {
            return Err(KcpNamespaceError::Namespace(namespace.to_string()));
        }
        Ok(KcpNamespace {
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LocatorSyncTarget {
    #[serde(default, alias = "workspace", alias = "path")]
    pub cluster: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
}

/// A resolved sync target: what it is called (for messages) and every key it may be known by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncTarget {
    /// The SyncTarget's name, when known.
    pub name: Option<String>,
    /// The logical cluster it lives in, when known.
    pub cluster: Option<String>,
    pub keys: Vec<SyncTargetKey>,
    /// How it was resolved: "config file" or "kcp syncer convention".
    pub via: &'static str,
}

impl SyncTarget {
    pub fn has_key(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k.0 == key)
    }
}

impl fmt::Display for SyncTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name, &self.cluster) {
            (Some(n), Some(c)) => write!(f, "sync target \"{n}\" (cluster {c})"),
            (Some(n), None) => write!(f, "sync target \"{n}\""),
            _ => write!(
                f,
                "sync target with key {}",
                self.keys.first().map(|k| k.0.as_str()).unwrap_or("?")
            ),
        }
    }
}

/// What the requester is, for the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requester {
    /// Never held: anyone who is not a sync target.
    NotSyncTarget,
    SyncTarget(SyncTarget),
    /// Looks like a syncer, but the namespace's locator does not prove which sync target.
    UnresolvedSyncer {
        reason: String,
    },
}

/// One explicitly configured identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplicitIdentity {
    pub target: SyncTarget,
}

/// How usernames map to sync targets, and which annotation domains and key schemes count.
#[derive(Debug, Clone)]
pub struct Identities {
    explicit: HashMap<String, SyncTarget>,
    schemes: Vec<KeyScheme>,
    finalizer_prefixes: Vec<String>,
    locator_keys: Vec<String>,
    /// Each distinct locator's sync target, hashed once and shared by every namespace that
    /// names it: a physical cluster under kcp has thousands of namespaces per sync target.
    located: Arc<Mutex<HashMap<LocatorParts, Weak<Located>>>>,
    /// Whether namespaces keep the kcp namespace their locator names (`--kcp-kubeconfig`):
    /// without kcp nothing reads it, and the cache does not pay for it.
    reads_kcp: bool,
}

/// What a locator's hashes depend on: the sync target's cluster (or the locator's), name, UID.
type LocatorParts = (Box<str>, Box<str>, Box<str>);

impl Default for Identities {
    fn default() -> Self {
        Identities::new(
            &["kcp.io".to_string(), "kcp.dev".to_string()],
            &[KeyScheme::Current, KeyScheme::Legacy],
        )
    }
}

impl Identities {
    pub fn new(domains: &[String], schemes: &[KeyScheme]) -> Self {
        Identities {
            explicit: HashMap::new(),
            schemes: schemes.to_vec(),
            finalizer_prefixes: domains
                .iter()
                .map(|d| format!("finalizers.workload.{d}/"))
                .collect(),
            locator_keys: domains
                .iter()
                .map(|d| format!("{d}/namespace-locator"))
                .collect(),
            located: Arc::default(),
            reads_kcp: false,
        }
    }

    /// Keep, for every located namespace, the kcp namespace its locator names (see
    /// `NamespaceMeta::from_annotations`): set when handoff reads kcp.
    pub fn set_reads_kcp(&mut self, on: bool) {
        self.reads_kcp = on;
    }

    pub fn reads_kcp(&self) -> bool {
        self.reads_kcp
    }

    /// Name a username's sync target by its key.
    pub fn add_key(&mut self, username: &str, key: &str) {
        self.explicit.insert(
            username.to_string(),
            SyncTarget {
                name: None,
                cluster: None,
                keys: vec![SyncTargetKey(key.to_string())],
                via: "config file",
            },
        );
    }

    /// Name a username's sync target by logical cluster and name; keys follow the schemes.
    pub fn add_cluster_name(&mut self, username: &str, cluster: &str, name: &str) {
        let target = self.target_for(cluster, name, "config file");
        self.explicit.insert(username.to_string(), target);
    }

    fn target_for(&self, cluster: &str, name: &str, via: &'static str) -> SyncTarget {
        SyncTarget {
            name: Some(name.to_string()),
            cluster: Some(cluster.to_string()),
            keys: self
                .schemes
                .iter()
                .map(|s| sync_target_key(cluster, name, *s))
                .collect(),
            via,
        }
    }

    /// The identities the config file names, by username.
    pub fn explicit(&self) -> impl Iterator<Item = (&str, &SyncTarget)> {
        self.explicit.iter().map(|(u, t)| (u.as_str(), t))
    }

    /// Every sync target some namespace's locator names now, with the UID it was named by:
    /// what the in-API-server policy needs published, since CEL cannot hash.
    pub fn located_targets(&self) -> Vec<(String, Arc<Located>)> {
        let table = self.located.lock().unwrap_or_else(|e| e.into_inner());
        table
            .iter()
            .filter_map(|((_, _, uid), w)| Some((uid.to_string(), w.upgrade()?)))
            .collect()
    }

    pub fn finalizer_prefixes(&self) -> &[String] {
        &self.finalizer_prefixes
    }

    pub fn locator_keys(&self) -> &[String] {
        &self.locator_keys
    }

    /// Whether the sync-target key in `annotation` if it is a soft-finalizer annotation.
    pub fn finalizer_key<'a>(&self, annotation: &'a str) -> Option<&'a str> {
        self.finalizer_prefixes
            .iter()
            .find_map(|p| annotation.strip_prefix(p.as_str()))
            .filter(|k| !k.is_empty())
    }

    /// Whether this username could be a sync target at all. Requests from anyone else are
    /// decided without reading any state, so an unreachable API never holds them.
    pub fn is_candidate(&self, username: &str) -> bool {
        self.explicit.contains_key(username) || parse_syncer_username(username).is_some()
    }

    /// Resolve the requester, using the locator of the namespace it acts in.
    pub fn resolve(&self, username: &str, locator: Option<&NamespaceLocator>) -> Requester {
        self.resolve_located(username, locator.map(|l| self.locate(l)).as_ref())
    }

    /// Do the hashing a locator needs once, when its namespace enters the cache, rather than
    /// on every request: the syncer id of the sync target's UID and the keys of its name.
    pub fn locate(&self, loc: &NamespaceLocator) -> Located {
        let Some(st) = loc.sync_target.as_ref() else {
            return Located::Unusable("the namespace locator names no syncTarget".to_string());
        };
        let cluster = if st.cluster.is_empty() {
            loc.cluster.as_deref().unwrap_or("")
        } else {
            st.cluster.as_str()
        };
        if cluster.is_empty() {
            return Located::Unusable("the namespace locator names no logical cluster".to_string());
        }
        Located::Target {
            id: syncer_id(&st.uid),
            target: self.target_for(cluster, &st.name, "kcp syncer convention"),
        }
    }

    /// `locate`, shared: namespaces whose locators name the same sync target (same cluster,
    /// name and UID) get the same `Arc`, and the hashing is done once per sync target.
    pub fn locate_shared(&self, loc: &NamespaceLocator) -> Arc<Located> {
        let Some(st) = loc.sync_target.as_ref() else {
            return Arc::new(self.locate(loc));
        };
        let cluster = match st.cluster.is_empty() {
            true => loc.cluster.as_deref().unwrap_or(""),
            false => st.cluster.as_str(),
        };
        let parts: LocatorParts = (
            cluster.into(),
            st.name.as_str().into(),
            st.uid.as_str().into(),
        );
        let mut table = self.located.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = table.get(&parts).and_then(Weak::upgrade) {
            return l;
        }
        let l = Arc::new(self.locate(loc));
        // Forget sync targets no namespace names any more, now and then.
        if table.len() >= 64 && table.len().is_power_of_two() {
            table.retain(|_, w| w.strong_count() > 0);
        }
        table.insert(parts, Arc::downgrade(&l));
        l
    }

    /// Resolve the requester against what the namespace's locator says (see `locate`).
    pub fn resolve_located(&self, username: &str, located: Option<&Located>) -> Requester {
        if let Some(t) = self.explicit.get(username) {
            return Requester::SyncTarget(t.clone());
        }
        let Some(sa) = parse_syncer_username(username) else {
            return Requester::NotSyncTarget;
        };
        let (id, target) = match located {
            None => {
                return Requester::UnresolvedSyncer {
                    reason: format!(
                        "the namespace has no {} annotation naming a sync target",
                        self.locator_keys.join(" or ")
                    ),
                };
            }
            Some(Located::Unusable(reason)) => {
                return Requester::UnresolvedSyncer {
                    reason: reason.clone(),
                };
            }
            Some(Located::Target { id, target }) => (id, target),
        };
        let name = target.name.as_deref().unwrap_or_default();
        if name != sa.sync_target_name {
            return Requester::UnresolvedSyncer {
                reason: format!(
                    "the namespace locator names sync target \"{name}\", not \"{}\"",
                    sa.sync_target_name
                ),
            };
        }
        if id != sa.id {
            return Requester::UnresolvedSyncer {
                reason: format!(
                    "the syncer id {} does not match the locator's sync target UID (which hashes to {id})",
                    sa.id
                ),
            };
        }
        Requester::SyncTarget(target.clone())
    }
}

/// A namespace locator with its hashes done: the sync target it names, or why it names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    Target {
        /// The syncer id that sync target's UID hashes to.
        id: String,
        target: SyncTarget,
    },
    Unusable(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kcp_key_vectors() {
        // (cluster, name, scheme, key): the first two from kcp's own tests (docs/ARCHITECTURE.md §1.1), the
        // rest computed with Python's hashlib from the same algorithm (SHA-224, big.Int.Text(62)).
        let rows = [
            (
                "root:org:ws",
                "us-west1",
                KeyScheme::Current,
                "6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
            ),
            (
                "root:org:ws",
                "us-west1",
                KeyScheme::Legacy,
                "2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5",
            ),
            (
                "root",
                "cluster1",
                KeyScheme::Current,
                "8eRqx15sXsQB2sc3x9hze2VmODj0GvYygZKlMr",
            ),
            (
                "root:default",
                "kind",
                KeyScheme::Current,
                "9n9rGKKatfebK5a6CBFCP8fMZUAt5laha6y7gS",
            ),
            (
                "root:org:ws",
                "us-east1",
                KeyScheme::Current,
                "1q5XrgW8fxFMT4ZQa6lVIrD2wF7Vaw0fgFzJso",
            ),
        ];
        for (cluster, name, scheme, want) in rows {
            assert_eq!(
                sync_target_key(cluster, name, scheme).0,
                want,
                "{cluster} {name} {scheme:?}"
            );
        }
    }

    #[test]
    fn syncer_id_vectors() {
        assert_eq!(syncer_id("syncTargetUID"), "1nuzj7pw");
        assert_eq!(
            syncer_id("3f2d1e43-7c38-4c36-9d1c-6c4bcc4e0d5b"),
            "1i4xa7bp"
        );
        // The digest starts with a zero byte: martinlindhe/base36 keeps a leading "0".
        assert_eq!(
            syncer_id("00000000-0000-0000-0000-000000000189"),
            "0fmqaeax"
        );
    }

    #[test]
    fn base_conversion_matches_go_big_int_text() {
        assert_eq!(big_endian_to_base(&[], BASE62), "0");
        assert_eq!(big_endian_to_base(&[0, 0], BASE62), "0");
        assert_eq!(big_endian_to_base(&[61], BASE62), "Z");
        assert_eq!(big_endian_to_base(&[62], BASE62), "10");
        assert_eq!(big_endian_to_base(&[1, 0], &BASE62[..36]), "74");
        assert_eq!(big_endian_to_base(&[0xff, 0xff], &BASE62[..16]), "ffff");
    }

    /// The limb-wise division against plain byte-wise long division, one digit at a time,
    /// over digests and lengths that put zeros at every place a chunk boundary can fall.
    #[test]
    fn base_conversion_matches_byte_wise_division() {
        fn reference(bytes: &[u8], alphabet: &[u8]) -> String {
            let base = alphabet.len() as u32;
            let mut num: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
            let mut digits = Vec::new();
            while !num.is_empty() {
                let mut rem = 0u32;
                let mut quotient = Vec::new();
                for &b in &num {
                    let acc = (rem << 8) | u32::from(b);
                    if !(quotient.is_empty() && acc / base == 0) {
                        quotient.push((acc / base) as u8);
                    }
                    rem = acc % base;
                }
                digits.push(alphabet[rem as usize]);
                num = quotient;
            }
            if digits.is_empty() {
                digits.push(alphabet[0]);
            }
            digits.reverse();
            String::from_utf8(digits).unwrap()
        }
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for i in 0..300u32 {
            let d = Sha224::digest(i.to_be_bytes()).to_vec();
            inputs.push(d[..(i as usize % 29)].to_vec());
            let mut z = d.clone();
            z[..(i as usize % 5)].fill(0);
            inputs.push(z);
        }
        // Powers of the bases and their neighbours: runs of zero digits inside a chunk.
        for base in [36u128, 62] {
            let mut p = 1u128;
            while let Some(next) = p.checked_mul(base) {
                p = next;
                for v in [p - 1, p, p + 1] {
                    inputs.push(v.to_be_bytes().to_vec());
                }
            }
        }
        for bytes in &inputs {
            for alphabet in [&BASE62[..], &BASE62[..36], &BASE62[..16], &BASE62[..2]] {
                assert_eq!(
                    big_endian_to_base(bytes, alphabet),
                    reference(bytes, alphabet),
                    "{bytes:?} base {}",
                    alphabet.len()
                );
            }
        }
    }

    #[test]
    fn syncer_usernames() {
        let ok = parse_syncer_username(
            "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw",
        )
        .unwrap();
        assert_eq!(ok.sync_target_name, "us-west1");
        assert_eq!(ok.id, "1nuzj7pw");
        assert_eq!(ok.namespace, "kcp-syncer-us-west1-1nuzj7pw");
        for bad in [
            "admin",
            "system:serviceaccount:ns:default",
            "system:serviceaccount:ns:kcp-syncer-us-west1",
            "system:serviceaccount:ns:kcp-syncer--1nuzj7pw",
            "system:serviceaccount:ns:kcp-syncer-x-1NUZJ7PW",
            "system:serviceaccount::kcp-syncer-x-1nuzj7pw",
            "kcp-syncer-us-west1-1nuzj7pw",
        ] {
            assert_eq!(parse_syncer_username(bad), None, "{bad}");
        }
    }

    fn locator(json: &str) -> NamespaceLocator {
        serde_json::from_str(json).unwrap()
    }

    const SYNCER: &str =
        "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw";

    #[test]
    fn resolution_paths() {
        let mut ids = Identities::default();
        ids.add_key("alice", "K1");
        ids.add_cluster_name("bob", "root:org:ws", "us-west1");
        let current = locator(
            r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#,
        );
        let legacy = locator(
            r#"{"syncTarget":{"workspace":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"workspace":"root:org:ws","namespace":"test"}"#,
        );
        let other_uid = locator(
            r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"other"},"cluster":"root:org:ws"}"#,
        );
        let other_name = locator(
            r#"{"syncTarget":{"cluster":"root:org:ws","name":"eu","uid":"syncTargetUID"}}"#,
        );
        let want_keys = vec![
            SyncTargetKey("6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g".into()),
            SyncTargetKey("2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5".into()),
        ];

        // explicit by key
        match ids.resolve("alice", None) {
            Requester::SyncTarget(t) => {
                assert_eq!(t.keys, vec![SyncTargetKey("K1".into())]);
                assert_eq!(t.via, "config file");
            }
            r => panic!("{r:?}"),
        }
        // explicit by cluster + name: both schemes
        match ids.resolve("bob", None) {
            Requester::SyncTarget(t) => assert_eq!(t.keys, want_keys),
            r => panic!("{r:?}"),
        }
        // convention, kcp.io and kcp.dev locators
        for loc in [&current, &legacy] {
            match ids.resolve(SYNCER, Some(loc)) {
                Requester::SyncTarget(t) => {
                    assert_eq!(t.keys, want_keys);
                    assert_eq!(t.name.as_deref(), Some("us-west1"));
                    assert_eq!(t.via, "kcp syncer convention");
                }
                r => panic!("{r:?}"),
            }
        }
        // looks like a syncer, cannot be proven
        for (loc, why) in [
            (
                None,
                "no kcp.io/namespace-locator or kcp.dev/namespace-locator",
            ),
            (Some(&other_uid), "does not match"),
            (Some(&other_name), "names sync target \"eu\""),
        ] {
            match ids.resolve(SYNCER, loc) {
                Requester::UnresolvedSyncer { reason } => assert!(reason.contains(why), "{reason}"),
                r => panic!("{r:?}"),
            }
        }
        // everyone else
        assert_eq!(
            ids.resolve("admin", Some(&current)),
            Requester::NotSyncTarget
        );
        assert!(!ids.is_candidate("system:kube-controller-manager"));
        assert!(ids.is_candidate(SYNCER) && ids.is_candidate("alice"));
    }

    #[test]
    fn single_scheme_and_domain() {
        let ids = Identities::new(&["kcp.dev".to_string()], &[KeyScheme::Legacy]);
        assert_eq!(
            ids.finalizer_key("finalizers.workload.kcp.dev/abc"),
            Some("abc")
        );
        assert_eq!(ids.finalizer_key("finalizers.workload.kcp.io/abc"), None);
        assert_eq!(ids.finalizer_key("finalizers.workload.kcp.dev/"), None);
        let legacy = locator(
            r#"{"syncTarget":{"workspace":"root:org:ws","name":"us-west1","uid":"syncTargetUID"}}"#,
        );
        match ids.resolve(SYNCER, Some(&legacy)) {
            Requester::SyncTarget(t) => assert_eq!(
                t.keys,
                vec![SyncTargetKey(
                    "2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5".into()
                )]
            ),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn kcp_namespace_of_each_locator_form() {
        let at = |cluster: &str, namespace: &str| {
            Ok(KcpNamespace {
                cluster: cluster.into(),
                namespace: namespace.into(),
            })
        };
        let rows: Vec<(&str, &str, Result<KcpNamespace, &str>)> = vec![
            (
                "kcp.io locator",
                r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"u"},"cluster":"root:org:ws","namespace":"test"}"#,
                at("root:org:ws", "test"),
            ),
            (
                "legacy kcp.dev locator says workspace",
                r#"{"syncTarget":{"workspace":"root:org:ws","name":"us-west1","uid":"u"},"workspace":"root:org:ws","namespace":"test"}"#,
                at("root:org:ws", "test"),
            ),
            (
                "the namespace's cluster, not the sync target's",
                r#"{"syncTarget":{"cluster":"root:compute","name":"us-west1","uid":"u"},"cluster":"root:org:ws","namespace":"app"}"#,
                at("root:org:ws", "app"),
            ),
            (
                "a logical cluster name rather than a path",
                r#"{"syncTarget":{"cluster":"2x1lq9q8a6w0p5cw","name":"n","uid":"u"},"cluster":"2x1lq9q8a6w0p5cw","namespace":"default"}"#,
                at("2x1lq9q8a6w0p5cw", "default"),
            ),
            (
                "no top-level cluster: the sync target's is no fallback",
                r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"u"},"namespace":"test"}"#,
                Err("names no logical cluster"),
            ),
            (
                "no namespace",
                r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"u"},"cluster":"root:org:ws"}"#,
                Err("names no kcp namespace"),
            ),
            (
                "a slash would leave the path segment",
                r#"{"cluster":"root/../../api","namespace":"test"}"#,
                Err("not a kcp logical cluster name"),
            ),
            (
                "the wildcard is not a cluster",
                r#"{"cluster":"*","namespace":"test"}"#,
                Err("not a kcp logical cluster name"),
            ),
            (
                "an empty segment",
                r#"{"cluster":"root::ws","namespace":"test"}"#,
                Err("not a kcp logical cluster name"),
            ),
            (
                "a namespace needing escapes",
                r#"{"cluster":"root:org:ws","namespace":"te st%2F"}"#,
                Err("not a namespace name"),
            ),
            (
                "upper case",
                r#"{"cluster":"root:org:ws","namespace":"Test"}"#,
                Err("not a namespace name"),
            ),
        ];
        for (name, json, want) in rows {
            let got = locator(json).kcp_namespace();
            match (&got, &want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{name}"),
                (Err(g), Err(w)) => assert!(g.to_string().contains(w), "{name}: {g}"),
                _ => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
        let ns = at("root:org:ws", "test").unwrap();
        assert_eq!(ns.path(), "/clusters/root:org:ws/api/v1/namespaces/test");
        assert_eq!(
            at("2x1lq9q8a6w0p5cw", "default").unwrap().path(),
            "/clusters/2x1lq9q8a6w0p5cw/api/v1/namespaces/default"
        );
        // The path parses as a URI path as it is: nothing in it needs escaping.
        let uri: http::Uri = format!("https://kcp.example{}", ns.path()).parse().unwrap();
        assert_eq!(uri.path(), ns.path());
    }
}
