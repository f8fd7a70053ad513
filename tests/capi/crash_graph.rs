//! What "nothing lost" compares (`crash.rs`): every object of the move by kind and name, its
//! owners, and a hash of what a move must carry over unchanged.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::capi::{BLOCK_MOVE, DELETE_FOR_MOVE, Mgmt};

use super::crash::NS;

/// An object of the move: its owners (kind, name), and a hash of what a move must carry over
/// unchanged (`content`).
#[derive(Debug, Clone)]
pub(super) struct Object {
    pub owners: BTreeSet<(String, String)>,
    pub hash: String,
    /// What was hashed, for the message when it differs.
    pub content: serde_json::Value,
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.owners == other.owners && self.hash == other.hash
    }
}

/// The objects of the move by (kind, name).
pub(super) type Graph = BTreeMap<(String, String), Object>;

/// What a move must carry over unchanged: a Secret's type and data (a workload cluster's CA is
/// there), a ConfigMap's data, the spec of the rest, and every object's labels and
/// annotations but those the move itself writes (`MOVE_ANNOTATIONS`). Not compared: the rest
/// of the metadata (clusterctl drops uid and resourceVersion and rewrites owner references;
/// the owners are compared by kind and name instead), status (clusterctl does not move it: the
/// target's controllers rebuild it), and a Cluster's `spec.paused`, which clusterctl sets in
/// the source before the copy, copies, and clears in the target as its last step.
fn content(o: &serde_json::Value) -> serde_json::Value {
    let mut annotations = o["metadata"]["annotations"].clone();
    if let Some(a) = annotations.as_object_mut() {
        a.retain(|k, _| !MOVE_ANNOTATIONS.contains(&k.as_str()) && !k.starts_with("handoff.dev/"));
    }
    // No map and an empty one are the same metadata: an object whose only annotation was the
    // move's own keeps an empty map once it is taken away.
    let none_if_empty = |v: serde_json::Value| match v.as_object() {
        Some(m) if m.is_empty() => serde_json::Value::Null,
        _ => v,
    };
    let meta = serde_json::json!({
        "labels": none_if_empty(o["metadata"]["labels"].clone()),
        "annotations": none_if_empty(annotations),
    });
    match o["kind"].as_str().unwrap_or("") {
        "Secret" => serde_json::json!({ "meta": meta, "type": o["type"], "data": o["data"] }),
        "ConfigMap" => serde_json::json!({
            "meta": meta,
            "data": o["data"],
            "binaryData": o["binaryData"],
        }),
        kind => {
            let mut spec = o["spec"].clone();
            if kind == "Cluster"
                && let Some(spec) = spec.as_object_mut()
            {
                spec.remove("paused");
            }
            serde_json::json!({ "meta": meta, "spec": spec })
        }
    }
}

/// The annotations a move writes and takes away again: clusterctl's pause (on ClusterClasses
/// and the objects of a paused Cluster), its delete-for-move mark in the source, and the
/// providers' (and handoff's) block-move. A copy keeps every other annotation.
const MOVE_ANNOTATIONS: [&str; 3] = ["cluster.x-k8s.io/paused", DELETE_FOR_MOVE, BLOCK_MOVE];

/// A hash of `v` that does not depend on the order of its keys.
fn stable_hash(v: &serde_json::Value) -> String {
    fn canonical(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    out.push_str(&serde_json::Value::from(k.as_str()).to_string());
                    out.push(':');
                    canonical(&m[k], out);
                    out.push(',');
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for x in a {
                    canonical(x, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    use sha2::Digest as _;
    let mut s = String::new();
    canonical(v, &mut s);
    let digest = sha2::Sha256::digest(s.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The top-level fields in which two contents differ, for a message.
pub(super) fn fields_differing(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (ma, mb) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    let keys: BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
    keys.into_iter()
        .filter(|k| ma.get(*k) != mb.get(*k))
        .map(|k| {
            let show = |v: Option<&serde_json::Value>| {
                let s = v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
                match s.chars().count() > 120 {
                    true => format!(
                        "{}… ({} bytes)",
                        s.chars().take(120).collect::<String>(),
                        s.len()
                    ),
                    false => s,
                }
            };
            format!("{k}: {} → {}", show(ma.get(k)), show(mb.get(k)))
        })
        .collect()
}

/// How `now` differs from `before`, one line each: an object missing or added, its owners or
/// its content changed.
pub(super) fn differences(before: &Graph, now: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (k, b) in before {
        match now.get(k) {
            None => out.push(format!("{k:?}: missing")),
            Some(n) if n.owners != b.owners => {
                out.push(format!("{k:?}: owners {:?} → {:?}", b.owners, n.owners))
            }
            Some(n) if n.hash != b.hash => out.push(format!(
                "{k:?}: content {} → {}: {}",
                b.hash,
                n.hash,
                fields_differing(&b.content, &n.content).join("; ")
            )),
            Some(_) => {}
        }
    }
    for k in now.keys().filter(|k| !before.contains_key(*k)) {
        out.push(format!("{k:?}: not there before"));
    }
    out
}

/// The objects of the move; every owner reference must resolve by UID to an object of the
/// same cluster.
pub(super) fn graph(m: &Mgmt) -> Graph {
    let objects = m.move_objects(NS);
    let by_uid: BTreeMap<&str, (String, String)> = objects
        .iter()
        .map(|o| {
            (
                o["metadata"]["uid"].as_str().unwrap_or(""),
                (
                    o["kind"].as_str().unwrap_or("").to_string(),
                    o["metadata"]["name"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect();
    let mut out = BTreeMap::new();
    for o in &objects {
        let key = (
            o["kind"].as_str().unwrap_or("").to_string(),
            o["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        let mut owners = BTreeSet::new();
        for r in o["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let owner = (
                r["kind"].as_str().unwrap_or("").to_string(),
                r["name"].as_str().unwrap_or("").to_string(),
            );
            let uid = r["uid"].as_str().unwrap_or("");
            assert_eq!(
                by_uid.get(uid),
                Some(&owner),
                "{}: {key:?}'s owner {owner:?} ({uid}) is no object of this cluster",
                m.name
            );
            owners.insert(owner);
        }
        let content = content(o);
        let hash = stable_hash(&content);
        out.insert(
            key,
            Object {
                owners,
                hash,
                content,
            },
        );
    }
    out
}

/// "Nothing lost" notices what it claims to: a label, an annotation, a Secret's type or a
/// ConfigMap's data changed is a different object; the move's own annotations, a Cluster's
/// `spec.paused` and the server's metadata are not.
#[test]
fn nothing_lost_tells_a_changed_label_annotation_type_or_configmap() {
    let hash = |o: &serde_json::Value| stable_hash(&content(o));
    let cluster = serde_json::json!({
        "kind": "Cluster",
        "metadata": {"name": "wl1", "labels": {"team": "a"}, "annotations": {"note": "x"},
                     "resourceVersion": "7", "uid": "u1"},
        "spec": {"paused": false, "topology": {"version": "v1.31.0"}},
    });
    let mut same = cluster.clone();
    same["metadata"]["resourceVersion"] = "9".into();
    same["metadata"]["uid"] = "u2".into();
    same["spec"]["paused"] = true.into();
    for a in MOVE_ANNOTATIONS
        .iter()
        .copied()
        .chain(["handoff.dev/anything"])
    {
        same["metadata"]["annotations"][a] = "set by the move".into();
    }
    assert_eq!(hash(&cluster), hash(&same));
    let bare = serde_json::json!({"kind": "Secret", "metadata": {"name": "s"}, "type": "t"});
    let mut emptied = bare.clone();
    emptied["metadata"]["annotations"] = serde_json::json!({});
    emptied["metadata"]["labels"] = serde_json::json!({});
    assert_eq!(hash(&bare), hash(&emptied));
    for (path, value) in [
        ("/metadata/labels/team", "b"),
        ("/metadata/annotations/note", "y"),
        ("/spec/topology/version", "v1.32.0"),
    ] {
        let mut changed = cluster.clone();
        *changed.pointer_mut(path).unwrap() = value.into();
        assert_ne!(hash(&cluster), hash(&changed), "{path}");
    }
    let secret = serde_json::json!({"kind": "Secret", "metadata": {"name": "s"},
                                    "type": "cluster.x-k8s.io/secret", "data": {"k": "dg=="}});
    let mut opaque = secret.clone();
    opaque["type"] = "Opaque".into();
    assert_ne!(hash(&secret), hash(&opaque));
    let config =
        serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}});
    let mut other = config.clone();
    other["data"]["k"] = "w".into();
    assert_ne!(hash(&config), hash(&other));
}
