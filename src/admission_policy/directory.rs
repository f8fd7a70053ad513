//! The published identities: what the guard's policy cannot compute, written into its
//! parameter ConfigMap, keyed by escaped username or by kcp syncer ServiceAccount name.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::cel::cel_str;
use super::{MANAGED_BY, ParamsRef};
use crate::rules::identity::{Identities, Located, SyncTarget};

/// Characters a username may carry besides `[-.a-zA-Z0-9]`, and how they are written in a
/// ConfigMap key (which allows only `[-._a-zA-Z0-9]`). `_` comes first: it is the escape.
pub(super) const ESCAPES: [(char, &str); 11] = [
    ('_', "_5f"),
    (':', "_3a"),
    ('@', "_40"),
    ('/', "_2f"),
    ('#', "_23"),
    ('+', "_2b"),
    ('=', "_3d"),
    ('%', "_25"),
    ('~', "_7e"),
    ('!', "_21"),
    (' ', "_20"),
];

/// Why an identity cannot be published in the guard's parameter ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error(
        "username {username:?}: the character {character:?} cannot be published to the admission policy (allowed: letters, digits, - . {})",
        ESCAPES.map(|(c, _)| c).iter().collect::<String>()
    )]
    Character { username: String, character: char },
    #[error("username {username:?} is too long to publish to the admission policy")]
    TooLong { username: String },
    #[error("{target}: a key is empty or holds a space or a comma")]
    Key { target: SyncTarget },
    #[error("{target}: its UID, name or cluster holds a space or a comma")]
    Field { target: SyncTarget },
}

/// The ConfigMap key of a configured username: `u.` and the username with `ESCAPES` applied.
/// The policy computes the same with a chain of `replace` (`cel_username_key`).
pub fn username_key(username: &str) -> Result<String, PublishError> {
    let mut key = String::from("u.");
    for c in username.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
            key.push(c);
        } else if let Some((_, e)) = ESCAPES.iter().find(|(x, _)| *x == c) {
            key.push_str(e);
        } else {
            return Err(PublishError::Character {
                username: username.to_string(),
                character: c,
            });
        }
    }
    if key.len() > 253 {
        return Err(PublishError::TooLong {
            username: username.to_string(),
        });
    }
    Ok(key)
}

pub(super) fn cel_username_key() -> String {
    let mut e = String::from("'u.' + variables.user");
    for (c, esc) in ESCAPES {
        let _ = write!(e, ".replace({}, '{esc}')", cel_str(&c.to_string()));
    }
    e
}

/// The key of a kcp syncer ServiceAccount name (`kcp-syncer-<name>-<id>`), whatever namespace
/// it runs in: the webhook ties a syncer to its sync target by that name alone.
pub fn service_account_key(sa_name: &str) -> String {
    format!("s.{sa_name}")
}

/// What the guard's policy reads: for each configured username and each kcp syncer that a
/// namespace's locator names, `"<uid> <name> <cluster> <key>,<key>"` (`-` for what is not
/// known). Entries that cannot be written are left out and returned with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directory {
    pub data: BTreeMap<String, String>,
    /// Sync targets of namespace locators that cannot be published: their syncers stay
    /// unresolved in the policy, held wherever any sync finalizer blocks.
    pub skipped: Vec<String>,
    /// Config-file identities that cannot be published: the policy would never hold them, so
    /// `handoff policy install` refuses.
    pub unpublishable: Vec<String>,
}

fn token(s: Option<&str>) -> Option<&str> {
    match s {
        None | Some("") => Some("-"),
        Some(t) if t.chars().any(|c| c.is_whitespace() || c == ',') => None,
        Some(t) => Some(t),
    }
}

fn entry(uid: Option<&str>, target: &SyncTarget) -> Result<String, PublishError> {
    let keys: Vec<&str> = target.keys.iter().map(|k| k.0.as_str()).collect();
    if keys.is_empty() || keys.iter().any(|k| token(Some(k)) != Some(k)) {
        return Err(PublishError::Key {
            target: target.clone(),
        });
    }
    let (Some(uid), Some(name), Some(cluster)) = (
        token(uid),
        token(target.name.as_deref()),
        token(target.cluster.as_deref()),
    ) else {
        return Err(PublishError::Field {
            target: target.clone(),
        });
    };
    Ok(format!("{uid} {name} {cluster} {}", keys.join(",")))
}

/// The identities to publish: the config file's, and every sync target some namespace's
/// locator names now (`Identities::located_targets`, or located from a list of namespaces).
pub fn directory(ids: &Identities, located: &[(String, std::sync::Arc<Located>)]) -> Directory {
    let mut dir = Directory::default();
    for (user, target) in ids.explicit() {
        match username_key(user).and_then(|k| Ok((k, entry(None, target)?))) {
            Ok((k, v)) => {
                dir.data.insert(k, v);
            }
            Err(e) => dir.unpublishable.push(e.to_string()),
        }
    }
    // In a fixed order, so that replicas with the same view publish the same content.
    let place = |l: &Located| match l {
        Located::Target { target, .. } => (target.cluster.clone(), target.name.clone()),
        Located::Unusable(_) => (None, None),
    };
    let mut located: Vec<_> = located.iter().collect();
    located.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| place(&a.1).cmp(&place(&b.1))));
    for (uid, l) in located {
        let Located::Target { id, target } = l.as_ref() else {
            continue;
        };
        let sa = format!(
            "kcp-syncer-{}-{id}",
            target.name.as_deref().unwrap_or_default()
        );
        let key = service_account_key(&sa);
        if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            || key.len() > 253
        {
            dir.skipped.push(format!(
                "{target}: its syncer name {sa:?} cannot be a ConfigMap key"
            ));
            continue;
        }
        match entry(Some(uid), target) {
            Ok(v) => {
                // Two locators naming the same syncer (same name and UID hash) with different
                // clusters: keep both key sets, so that either hold counts.
                let v = match dir.data.get(&key) {
                    Some(old) if old != &v => {
                        let mut parts: Vec<String> = old.split(' ').map(str::to_string).collect();
                        let new_keys = v.rsplit(' ').next().unwrap_or_default();
                        for k in new_keys.split(',') {
                            if !parts[3].split(',').any(|o| o == k) {
                                parts[3].push(',');
                                parts[3].push_str(k);
                            }
                        }
                        parts.join(" ")
                    }
                    _ => v,
                };
                dir.data.insert(key, v);
            }
            Err(e) => dir.skipped.push(e.to_string()),
        }
    }
    dir
}

/// The parameter ConfigMap, as `handoff policy install` and `handoff serve` apply it.
pub fn params_object(params: &ParamsRef, data: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": params.name,
            "namespace": params.namespace,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
            "annotations": {
                "handoff.dev/what": "sync-target identities for the ValidatingAdmissionPolicy handoff-sync-finalizer: u.<escaped username> (config file) and s.<kcp syncer ServiceAccount name> (namespace locators) to \"<uid> <sync target> <logical cluster> <keys>\"; kept current by handoff serve"
            }
        },
        "data": data,
    })
}
