//! A decision as it leaves handoff: the AdmissionResponse, the verdict and its reason for
//! logs, metrics and audit annotations, shaped by the rollout (`deliver`).

use std::collections::BTreeMap;

use crate::admission::{AdmissionRequest, AdmissionResponse};
use crate::rules::lease_hold::LeaseReason;
use crate::rules::move_window::PinReason;
use crate::rules::rollout::{self, Delivery, Rollout, Verdict};
use crate::rules::sync_finalizer::{AllowReason, Rule};

use super::Webhook;

/// Why a decision is what it is: its rule's reason, or the server's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    GuardAllow(AllowReason),
    GuardDeny(Rule),
    Pin(PinReason),
    Lease(LeaseReason),
    /// No decision within the API server's timeout.
    Deadline,
}

impl Reason {
    /// The label value of logs, metrics and audit annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::GuardAllow(r) => r.as_str(),
            Reason::GuardDeny(r) => r.as_str(),
            Reason::Pin(r) => r.as_str(),
            Reason::Lease(r) => r.as_str(),
            Reason::Deadline => "deadline",
        }
    }
}

/// A decision, ready to send and to log.
#[derive(Debug, Clone)]
pub struct Decision {
    pub response: AdmissionResponse,
    pub verdict: Verdict,
    pub reason: Reason,
    /// Human-readable detail for the log: the denial message or the pin.
    pub detail: String,
}

impl Decision {
    pub(super) fn allow(req: &AdmissionRequest, reason: Reason) -> Self {
        Decision {
            response: AdmissionResponse::allow(&req.uid),
            verdict: Verdict::Allow,
            reason,
            detail: String::new(),
        }
    }

    /// The pin's JSONPatch, with its warning (said to the client, and logged).
    pub(super) fn pin(
        req: &AdmissionRequest,
        reason: Reason,
        ops: &[crate::admission::PatchOp],
        warning: String,
    ) -> Self {
        let mut response = AdmissionResponse::allow(&req.uid).with_patch(ops);
        response.warnings.push(warning.clone());
        response.audit_annotations = audit(Verdict::Patch, reason);
        Decision {
            response,
            verdict: Verdict::Patch,
            reason,
            detail: warning,
        }
    }

    pub fn deny(req: &AdmissionRequest, reason: Reason, message: String) -> Self {
        let message = crate::rules::one_line(message);
        let mut response = AdmissionResponse::deny(&req.uid, 403, "Forbidden", message.clone());
        response.audit_annotations = audit(Verdict::Deny, reason);
        Decision {
            response,
            verdict: Verdict::Deny,
            reason,
            detail: message,
        }
    }
}

/// A denial or a pin, also recorded as audit annotations (the API server prefixes the keys
/// with the webhook's name). An enforced pin says `pin` there, as it always has.
fn audit(verdict: Verdict, reason: Reason) -> BTreeMap<String, String> {
    let decision = match verdict {
        Verdict::Patch => "pin",
        v => v.as_str(),
    };
    BTreeMap::from([
        ("decision".to_string(), decision.to_string()),
        ("reason".to_string(), reason.as_str().to_string()),
    ])
}

/// Shape a decision by the rollout: `warn` and `audit` let it pass unchanged (with the would-be
/// denial or pin as a warning under `warn`), an exempt requester passes with a warning that
/// says so. Every softened decision keeps its reason in the audit annotations.
pub fn deliver(
    rollout: &Rollout,
    webhook: Webhook,
    req: &AdmissionRequest,
    d: Decision,
) -> Decision {
    let mode = match webhook {
        Webhook::SyncFinalizer => rollout.sync_finalizer,
        Webhook::MoveWindow | Webhook::LeaseHold => rollout.move_window,
    };
    let exemption = rollout.exemption(&req.user_info.username, &req.user_info.groups);
    let delivery = rollout::deliver(d.verdict, mode, exemption.is_some());
    let would = match d.verdict {
        Verdict::Patch => "pin this",
        _ => "deny this request",
    };
    let warning = match (delivery, exemption) {
        (Delivery::AsDecided, _) => return d,
        (Delivery::Warn, _) => Some(format!(
            "handoff would {would} ({} is in warn mode): {}",
            webhook.as_str(),
            d.detail
        )),
        (Delivery::Audit, _) => None,
        (Delivery::Exempt, Some(e)) => Some(format!(
            "exempt from the {} rule as {e}; handoff would otherwise {would}: {}",
            webhook.as_str(),
            d.detail
        )),
        (Delivery::Exempt, None) => unreachable!("deliver returns Exempt only for an exemption"),
    };
    let verdict = delivery.verdict(d.verdict);
    let mut response = AdmissionResponse::allow(&req.uid);
    response.warnings.extend(warning);
    response.audit_annotations = audit(verdict, d.reason);
    Decision {
        response,
        verdict,
        ..d
    }
}
