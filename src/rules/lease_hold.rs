//! The held-Lease guard (docs/ARCHITECTURE.md §1.2, §1.3): while a MoveWindow holds a controller's
//! leader-election Lease, only the window's operator may change or delete it.
//!
//! Everything it needs travels in the request: `handoff window open` writes the hold onto the
//! Lease itself (a label naming the window, an annotation naming the operator), so the rule
//! reads no cache and is never in doubt. The registration sends handoff only Leases carrying
//! the label (an `objectSelector`, which for UPDATE also matches the old object and for DELETE
//! matches the object deleted), so node heartbeats and the control plane's own Leases never
//! reach it.

use std::collections::BTreeMap;

use crate::admission::{AdmissionRequest, Operation};

/// On a held Lease: the MoveWindow that holds it.
pub const HELD_BY_LABEL: &str = "handoff.dev/held-by-window";
/// On a held Lease: the username of whoever opened the window (a SelfSubjectReview's answer).
pub const OPERATOR_ANNOTATION: &str = "handoff.dev/window-operator";
/// On a held Lease: its `holderIdentity` before the window took it.
pub const FORMER_HOLDER_ANNOTATION: &str = "handoff.dev/former-holder";
/// On a held Lease: its `leaseDurationSeconds` before the window took it.
pub const FORMER_DURATION_ANNOTATION: &str = "handoff.dev/former-lease-duration-seconds";

/// The `holderIdentity` a window writes. It has a `/`, which no pod name (the hostname part of
/// a controller-runtime identity) can have, so it never names a candidate.
pub fn holder_identity(window: &str) -> String {
    format!("handoff.dev/move-window/{window}")
}

/// The window a holder identity names, if it is one of ours.
pub fn window_of_holder(holder: &str) -> Option<&str> {
    holder.strip_prefix("handoff.dev/move-window/")
}

/// A write to a Lease, as the guard reads it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseWrite<'a> {
    pub operation: Operation,
    pub username: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The Lease as stored before this write (`oldObject`); `None` on CREATE.
    pub old_labels: Option<&'a BTreeMap<String, String>>,
    pub old_annotations: Option<&'a BTreeMap<String, String>>,
}

impl<'a> LeaseWrite<'a> {
    /// `None` when the request is not a write to a Lease.
    pub fn from_review(req: &'a AdmissionRequest) -> Option<Self> {
        let is_lease = req.resource.group == "coordination.k8s.io"
            && req.resource.resource == "leases"
            && req.sub_resource.as_deref().unwrap_or("").is_empty();
        if !is_lease {
            return None;
        }
        let old = req.old_object.as_ref().map(|o| &o.metadata);
        Some(LeaseWrite {
            operation: req.operation,
            username: &req.user_info.username,
            namespace: req.namespace.as_deref().unwrap_or(""),
            name: req.object_name().unwrap_or(""),
            old_labels: old.and_then(|m| m.labels.as_ref()),
            old_annotations: old.and_then(|m| m.annotations.as_ref()),
        })
    }
}

/// Why the guard decided as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseReason {
    /// Not an UPDATE or DELETE of a Lease.
    NotApplicable,
    /// No window holds the stored Lease.
    NotHeld,
    /// The writer is the operator of the window that holds it.
    WindowOperator,
    /// A window holds it, and the writer is not its operator.
    LeaseHeld,
}

impl LeaseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseReason::NotApplicable => "not-applicable",
            LeaseReason::NotHeld => "not-held",
            LeaseReason::WindowOperator => "window-operator",
            LeaseReason::LeaseHeld => "lease-held",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseVerdict {
    Allow(LeaseReason),
    /// Always for `LeaseReason::LeaseHeld`.
    Deny {
        message: String,
    },
}

impl LeaseVerdict {
    pub fn reason(&self) -> LeaseReason {
        match self {
            LeaseVerdict::Allow(r) => *r,
            LeaseVerdict::Deny { .. } => LeaseReason::LeaseHeld,
        }
    }
}

/// Only the stored Lease decides: a write that takes a Lease (the label is new) is the
/// window's own take-over and passes; a write to a Lease already held passes for its operator
/// alone, whatever it writes, so `close` can release it and nobody else can take it back.
pub fn decide(w: &LeaseWrite<'_>) -> LeaseVerdict {
    if !matches!(w.operation, Operation::Update | Operation::Delete) {
        return LeaseVerdict::Allow(LeaseReason::NotApplicable);
    }
    let Some(window) = w.old_labels.and_then(|l| l.get(HELD_BY_LABEL)) else {
        return LeaseVerdict::Allow(LeaseReason::NotHeld);
    };
    let operator = w
        .old_annotations
        .and_then(|a| a.get(OPERATOR_ANNOTATION))
        .map(String::as_str)
        .filter(|o| !o.is_empty());
    if operator == Some(w.username) {
        return LeaseVerdict::Allow(LeaseReason::WindowOperator);
    }
    let verb = match w.operation {
        Operation::Delete => "delete",
        _ => "change",
    };
    let who = match operator {
        Some(op) => format!("only its operator {op:?} may {verb} it"),
        None => format!("the hold names no operator, so nobody may {verb} it through handoff"),
    };
    LeaseVerdict::Deny {
        message: format!(
            "Lease {}/{} is held by MoveWindow {window:?}, which keeps the controller that leader-elects with it stopped while its webhooks serve during a cluster move; {who}. Release it with `handoff window close {window}` as {}",
            w.namespace,
            w.name,
            operator.unwrap_or("the window operator"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn write<'a>(
        op: Operation,
        user: &'a str,
        labels: Option<&'a BTreeMap<String, String>>,
        annotations: Option<&'a BTreeMap<String, String>>,
    ) -> LeaseWrite<'a> {
        LeaseWrite {
            operation: op,
            username: user,
            namespace: "capi-system",
            name: "controller-leader-election-capi",
            old_labels: labels,
            old_annotations: annotations,
        }
    }

    #[test]
    fn a_held_lease_is_the_operators_alone() {
        let held = map(&[(HELD_BY_LABEL, "move-1")]);
        let op = map(&[(OPERATOR_ANNOTATION, "alice")]);
        for operation in [Operation::Update, Operation::Delete] {
            assert_eq!(
                decide(&write(operation, "alice", Some(&held), Some(&op))),
                LeaseVerdict::Allow(LeaseReason::WindowOperator)
            );
            // The provider's own leader election, another admin, a controller: all refused,
            // and told who may and how.
            for other in [
                "system:serviceaccount:capi-system:capi-manager",
                "bob",
                "alice2",
                "",
            ] {
                let verdict = decide(&write(operation, other, Some(&held), Some(&op)));
                assert_eq!(verdict.reason().as_str(), "lease-held");
                let LeaseVerdict::Deny { message } = verdict else {
                    panic!("{other} may write a held Lease");
                };
                assert!(message.contains("MoveWindow \"move-1\""), "{message}");
                assert!(message.contains("handoff window close move-1"), "{message}");
                assert!(message.contains("\"alice\""), "{message}");
            }
        }
    }

    #[test]
    fn nothing_else_is_held() {
        let op = map(&[(OPERATOR_ANNOTATION, "alice")]);
        let unrelated = map(&[("app", "x"), ("handoff.dev/held-by", "move-1")]);
        for labels in [None, Some(&unrelated)] {
            for operation in [Operation::Update, Operation::Delete] {
                assert_eq!(
                    decide(&write(operation, "bob", labels, Some(&op))),
                    LeaseVerdict::Allow(LeaseReason::NotHeld)
                );
            }
        }
        // CREATE and CONNECT never hold: there is no stored Lease a window holds.
        let held = map(&[(HELD_BY_LABEL, "move-1")]);
        for operation in [Operation::Create, Operation::Connect] {
            assert_eq!(
                decide(&write(operation, "bob", Some(&held), Some(&op))),
                LeaseVerdict::Allow(LeaseReason::NotApplicable)
            );
        }
    }

    #[test]
    fn lease_writes_from_reviews() {
        let review = |resource: serde_json::Value, sub: &str| {
            let body = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u", "operation": "UPDATE", "name": "l", "namespace": "capi-system",
                "resource": resource, "subResource": sub, "userInfo": {"username": "alice"},
                "oldObject": {"metadata": {"name": "l", "labels": {HELD_BY_LABEL: "move-1"}}}}});
            crate::admission::decode_review(&serde_json::to_vec(&body).unwrap()).unwrap()
        };
        let leases = serde_json::json!({"group": "coordination.k8s.io", "version": "v1", "resource": "leases"});
        let r = review(leases.clone(), "");
        let w = LeaseWrite::from_review(&r).unwrap();
        assert_eq!(
            (w.namespace, w.name, w.username),
            ("capi-system", "l", "alice")
        );
        assert!(w.old_labels.is_some_and(|l| l[HELD_BY_LABEL] == "move-1"));
        let configmaps =
            serde_json::json!({"group": "", "version": "v1", "resource": "configmaps"});
        assert!(LeaseWrite::from_review(&review(configmaps, "")).is_none());
        assert!(LeaseWrite::from_review(&review(leases, "status")).is_none());
    }

    #[test]
    fn a_hold_without_an_operator_refuses_everyone() {
        let held = map(&[(HELD_BY_LABEL, "move-1")]);
        let empty = map(&[(OPERATOR_ANNOTATION, "")]);
        for annotations in [None, Some(&empty)] {
            for user in ["", "alice"] {
                assert!(matches!(
                    decide(&write(Operation::Update, user, Some(&held), annotations)),
                    LeaseVerdict::Deny { .. }
                ));
            }
        }
    }

    #[test]
    fn our_holder_identity_never_names_a_pod() {
        let h = holder_identity("move-1");
        assert_eq!(window_of_holder(&h), Some("move-1"));
        assert!(h.contains('/'));
        assert_eq!(
            window_of_holder("capi-controller-manager-7d9f8b6c4-x2k4j_1234"),
            None
        );
    }
}
