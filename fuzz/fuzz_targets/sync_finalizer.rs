//! The sync-finalizer guard on any decodable DELETE, against a held namespace (locator and
//! blocking finalizer, as in `src/rules/sync_finalizer.rs`'s tests), a held namespace without
//! a locator, a namespace carrying the request's `oldObject` annotations, a plain one and an
//! unreadable one.
//!
//! Each on a proven view and on one nothing has proven lately (docs/ARCHITECTURE.md §1.3).
//!
//! Invariants: no panic; a requester that cannot be a sync target is always allowed; a
//! denial message is non-empty and one line (kubectl prints it after "denied the request: ");
//! on an unproven view a sync target's delete is never allowed, only read again where the
//! proven view allows it, and every other verdict is the proven view's.
#![no_main]

use std::collections::BTreeMap;
use std::sync::LazyLock;

use handoff::admission::{Operation, decode_review};
use handoff::rules::identity::Identities;
use handoff::rules::sync_finalizer::{
    DeleteRequest, Freshness, GuardVerdict, KcpState, NamespaceMeta, NamespaceState, decide,
    decide_with_kcp,
};
use libfuzzer_sys::fuzz_target;

const KEY: &str = "6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";
const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;

static IDS: LazyLock<Identities> = LazyLock::new(|| {
    let mut ids = Identities::default();
    ids.add_cluster_name("explicit-user", "root:org:ws", "us-west1");
    ids.add_key("explicit-key-user", KEY);
    ids
});

fn meta(pairs: &[(&str, &str)]) -> NamespaceMeta {
    let ann: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    NamespaceMeta::from_annotations(Some(&ann), &IDS)
}

static HELD: LazyLock<NamespaceMeta> = LazyLock::new(|| {
    let m = meta(&[
        ("kcp.io/namespace-locator", LOCATOR),
        (
            "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
            "glbc-migration",
        ),
    ]);
    assert!(m.located.is_some() && m.holds().len() == 1, "{m:?}");
    m
});

static HELD_NO_LOCATOR: LazyLock<NamespaceMeta> = LazyLock::new(|| {
    meta(&[(
        "finalizers.workload.kcp.dev/2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5",
        "x",
    )])
});

fuzz_target!(|data: &[u8]| {
    let Ok(req) = decode_review(data) else {
        return;
    };
    let Some(del) = DeleteRequest::from_review(&req) else {
        assert_ne!(
            req.operation,
            Operation::Delete,
            "a DELETE was not read as one"
        );
        return;
    };
    let ids = &*IDS;
    let candidate = ids.is_candidate(del.username);
    if !candidate {
        assert_eq!(del.namespace_to_read(ids), None);
    }
    // Also a namespace whose annotations are the fuzzed object's own (for a Namespace delete,
    // what the cache would hold), so the fuzzer controls locators and finalizer values too.
    let from_object = req
        .old_object
        .as_ref()
        .map(|o| NamespaceMeta::from_annotations(o.metadata.annotations.as_ref(), ids));
    let states = [
        Some(NamespaceState::Known(&HELD)),
        Some(NamespaceState::Known(&HELD_NO_LOCATOR)),
        from_object.as_ref().map(NamespaceState::Known),
        Some(NamespaceState::Plain),
        Some(NamespaceState::Unavailable(
            "the API server did not answer within 3s",
        )),
    ];
    for state in states.into_iter().flatten() {
        let verdict = decide(&del, state, ids);
        if !candidate {
            assert!(
                verdict.is_allowed(),
                "non-candidate {:?} was held: {verdict:?}",
                del.username
            );
        }
        if let GuardVerdict::Deny { message, .. } = &verdict {
            assert!(!message.trim().is_empty(), "empty denial message");
            assert!(
                !message.contains(['\n', '\r']),
                "denial message is not one line: {message:?}"
            );
        }
        let unproven = decide_with_kcp(&del, state, KcpState::NotRead, Freshness::Unproven, ids);
        match (&unproven, del.namespace_to_read(ids)) {
            (GuardVerdict::ReadAgain, Some(_)) => assert!(verdict.is_allowed(), "{verdict:?}"),
            (GuardVerdict::ReadAgain, None) => panic!("{del:?} read again with nothing to read"),
            (GuardVerdict::Allow(_), Some(_)) => panic!("allowed on an unproven view: {del:?}"),
            (v, _) => assert_eq!(*v, verdict, "unproven view changed the verdict"),
        }
    }
});
