//! The kcp identity helpers on arbitrary strings: `sync_target_key`, `syncer_id`,
//! `parse_syncer_username` and `Identities::resolve` by the syncer convention.
//!
//! The input is split on NUL into (cluster, name, uid, username). Invariants: no panic; a key is
//! base62 with no leading zero and decodes back to the SHA-224 of its input; an id is the first
//! 8 characters of the UID's SHA-224 in kcp's base36 (a "0" per leading zero byte, then the
//! digits), so always 8 of [0-9a-z];
//! a parsed username rebuilds to itself; a username built from valid parts parses back to them;
//! a syncer whose namespace locator names its sync target resolves to that target's keys.
#![no_main]

use handoff::rules::identity::{
    Identities, KeyScheme, NamespaceLocator, Requester, SyncTargetKey, parse_syncer_username,
    sync_target_key, syncer_id,
};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha224};

const BASE62: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Digits in `alphabet` back to a big-endian byte string without leading zeros.
fn from_base(digits: &str, alphabet: &[u8]) -> Vec<u8> {
    let base = alphabet.len() as u32;
    let mut n: Vec<u8> = Vec::new(); // little-endian bytes
    for c in digits.bytes() {
        let d = alphabet
            .iter()
            .position(|a| *a == c)
            .unwrap_or_else(|| panic!("{c:?} is not a digit of base {base} in {digits:?}"))
            as u32;
        let mut carry = d;
        for b in n.iter_mut() {
            let v = *b as u32 * base + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            n.push(carry as u8);
            carry >>= 8;
        }
    }
    n.reverse();
    n
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let i = b.iter().position(|x| *x != 0).unwrap_or(b.len());
    &b[i..]
}

/// A big-endian number in base 36, no leading zeros (Go's `big.Int.Text(36)`), by long
/// division on 32-bit limbs.
fn to_base36(bytes: &[u8]) -> String {
    let mut limbs: Vec<u32> = Vec::new(); // big-endian 32-bit limbs
    let b = strip_zeros(bytes);
    let pad = (4 - b.len() % 4) % 4;
    let padded: Vec<u8> = std::iter::repeat_n(0u8, pad)
        .chain(b.iter().copied())
        .collect();
    for c in padded.chunks(4) {
        limbs.push(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let mut out = Vec::new();
    while limbs.iter().any(|l| *l != 0) {
        let mut rem = 0u64;
        for l in limbs.iter_mut() {
            let acc = (rem << 32) | *l as u64;
            *l = (acc / 36) as u32;
            rem = acc % 36;
        }
        out.push(BASE62[rem as usize]);
    }
    if out.is_empty() {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

fn check_key(cluster: &str, name: &str, scheme: KeyScheme) -> SyncTargetKey {
    let key = sync_target_key(cluster, name, scheme);
    let k = key.0.as_str();
    assert!(!k.is_empty() && k.len() <= 38, "key length: {k:?}");
    assert!(
        k.bytes().all(|b| b.is_ascii_alphanumeric()),
        "not base62: {k:?}"
    );
    assert!(k == "0" || !k.starts_with('0'), "leading zero: {k:?}");
    let input = match scheme {
        KeyScheme::Current => format!("{cluster}:{name}"),
        KeyScheme::Legacy => format!("{cluster}{name}"),
    };
    let digest = Sha224::digest(input.as_bytes());
    assert_eq!(
        from_base(k, BASE62),
        strip_zeros(&digest),
        "key {k:?} is not base62 of SHA-224({input:?})"
    );
    key
}

fn check_id(uid: &str) -> String {
    let id = syncer_id(uid);
    assert!(id.len() <= 8, "id longer than 8: {id:?}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()),
        "id not [0-9a-z]: {id:?}"
    );
    let digest = Sha224::digest(uid.as_bytes());
    let full = to_base36(&digest);
    assert_eq!(
        from_base(&full, &BASE62[..36]),
        strip_zeros(&digest),
        "reference base36 is wrong"
    );
    // As kcp writes it with martinlindhe/base36: one "0" per leading zero byte of the digest,
    // then the number in base 36; the first 8 characters of that. Shorter than 8 only when
    // that text is (never, for a 28-byte digest).
    let zeros = digest.iter().take_while(|b| **b == 0).count();
    let text = if zeros == digest.len() {
        "0".repeat(zeros)
    } else {
        format!("{}{full}", "0".repeat(zeros))
    };
    assert_eq!(id, text[..text.len().min(8)], "id {id:?} of {text:?}");
    assert_eq!(id.len(), 8, "a SHA-224 digest always gives 8 characters");
    id
}

fn check_parse(username: &str) {
    let Some(sa) = parse_syncer_username(username) else {
        return;
    };
    assert!(!sa.namespace.is_empty() && !sa.namespace.contains(':'));
    assert!(!sa.sync_target_name.is_empty());
    assert!(
        sa.id.len() == 8
            && sa
                .id
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    );
    assert_eq!(
        format!(
            "system:serviceaccount:{}:kcp-syncer-{}-{}",
            sa.namespace, sa.sync_target_name, sa.id
        ),
        username
    );
    assert!(Identities::default().is_candidate(username));
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\0');
    let cluster = parts.next().unwrap_or("");
    let name = parts.next().unwrap_or("");
    let uid = parts.next().unwrap_or("");
    let username = parts.next().unwrap_or("");

    let current = check_key(cluster, name, KeyScheme::Current);
    let legacy = check_key(cluster, name, KeyScheme::Legacy);
    let id = check_id(uid);
    check_parse(username);
    check_parse(&text);
    assert_eq!(
        Identities::default().is_candidate(username),
        parse_syncer_username(username).is_some()
    );

    // A username built from valid parts parses back to them.
    let ns = if cluster.is_empty() || cluster.contains(':') {
        "kcp-syncer-ns"
    } else {
        cluster
    };
    if name.is_empty() || id.len() != 8 {
        return;
    }
    let built = format!("system:serviceaccount:{ns}:kcp-syncer-{name}-{id}");
    let sa = parse_syncer_username(&built).unwrap_or_else(|| panic!("{built:?} does not parse"));
    assert_eq!(
        (sa.namespace, sa.sync_target_name, sa.id),
        (ns, name, id.as_str())
    );

    // And a namespace locator naming that sync target resolves it by the convention.
    let locator: NamespaceLocator = serde_json::from_value(serde_json::json!({
        "syncTarget": {"cluster": cluster, "name": name, "uid": uid},
    }))
    .expect("locator JSON");
    let got = Identities::default().resolve(&built, Some(&locator));
    match got {
        Requester::SyncTarget(t) if !cluster.is_empty() => {
            assert_eq!(t.keys, vec![current, legacy]);
            assert_eq!(t.name.as_deref(), Some(name));
        }
        Requester::UnresolvedSyncer { .. } if cluster.is_empty() => {}
        other => panic!("{built:?} with locator {locator:?}: {other:?}"),
    }
});
