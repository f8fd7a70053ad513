//! The held-Lease guard on any decodable AdmissionReview, read as a write to a Lease.
//!
//! Invariants: no panic; it refuses exactly an UPDATE or DELETE of a Lease whose stored object
//! carries `handoff.dev/held-by-window`, by anyone but the non-empty operator written on it,
//! and every refusal names the window and how to release it.
#![no_main]

use handoff::admission::{Operation, decode_review};
use handoff::rules::lease_hold::{
    HELD_BY_LABEL, LeaseVerdict, LeaseWrite, OPERATOR_ANNOTATION, decide,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = decode_review(data) else {
        return;
    };
    // Any request read as a write to a Lease, through the webhook's own constructor.
    let mut sent = req.clone();
    sent.resource.group = "coordination.k8s.io".into();
    sent.resource.resource = "leases".into();
    sent.sub_resource = None;
    let w = LeaseWrite::from_review(&sent).expect("a write to a Lease");
    if req.resource.group != "coordination.k8s.io"
        || req.resource.resource != "leases"
        || !req.sub_resource.as_deref().unwrap_or("").is_empty()
    {
        assert!(
            LeaseWrite::from_review(&req).is_none(),
            "not a Lease: {req:?}"
        );
    }
    let old = req.old_object.as_ref().map(|o| &o.metadata);
    let labels = old.and_then(|m| m.labels.as_ref());
    let annotations = old.and_then(|m| m.annotations.as_ref());
    let window = labels.and_then(|l| l.get(HELD_BY_LABEL));
    let operator = annotations
        .and_then(|a| a.get(OPERATOR_ANNOTATION))
        .filter(|o| !o.is_empty());
    let must_refuse = matches!(req.operation, Operation::Update | Operation::Delete)
        && window.is_some()
        && operator != Some(&req.user_info.username);
    let verdict = decide(&w);
    match &verdict {
        LeaseVerdict::Allow(_) => assert!(!must_refuse, "allowed a write to a held Lease"),
        LeaseVerdict::Deny { message } => {
            assert!(must_refuse, "refused a write nobody holds");
            assert_eq!(verdict.reason().as_str(), "lease-held");
            let window = window.expect("held");
            assert!(message.contains(&format!("handoff window close {window}")));
        }
    }
});
