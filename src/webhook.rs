//! The edge between a decoded AdmissionReview and the rules: pick the webhook, read the state
//! its rule asks for, call the rule, deliver its verdict as the rollout says. Shared by `serve`
//! and `review`.

use std::collections::BTreeMap;

use crate::admission::{AdmissionRequest, AdmissionResponse, Operation};
use crate::rules::lease_hold::{self, LeaseReason, LeaseVerdict, LeaseWrite};
use crate::rules::move_window::{self, PinReason, PinRequest, PinVerdict, WindowView};
use crate::rules::rollout::{self, Delivery, Rollout, Verdict};
use crate::rules::sync_finalizer::{
    self, AllowReason, DeleteRequest, Freshness, GuardVerdict, Rule,
};
use crate::state::{KcpRead, NamespaceLookup, State};

/// The webhooks, by their paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Webhook {
    /// `POST /validate/sync-finalizer`
    SyncFinalizer,
    /// `POST /mutate/move-window`
    MoveWindow,
    /// `POST /validate/lease-hold`: part of the move window, served wherever the pin is.
    #[value(skip)]
    LeaseHold,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::SyncFinalizer => "sync-finalizer",
            Webhook::MoveWindow => "move-window",
            Webhook::LeaseHold => "lease-hold",
        }
    }

    /// The webhook the registrations in `manifests/` would send this request to.
    pub fn for_request(req: &AdmissionRequest) -> Option<Webhook> {
        match req.operation {
            Operation::Update | Operation::Delete
                if req.resource.group == "coordination.k8s.io"
                    && req.resource.resource == "leases"
                    && req.old_object.as_ref().is_some_and(|o| {
                        o.metadata
                            .labels
                            .as_ref()
                            .is_some_and(|l| l.contains_key(lease_hold::HELD_BY_LABEL))
                    }) =>
            {
                Some(Webhook::LeaseHold)
            }
            Operation::Delete => Some(Webhook::SyncFinalizer),
            Operation::Create | Operation::Update
                if req.resource.group == "apps"
                    && req.resource.resource == "deployments"
                    && matches!(req.sub_resource.as_deref(), None | Some("") | Some("scale")) =>
            {
                Some(Webhook::MoveWindow)
            }
            _ => None,
        }
    }
}

impl State {
    pub fn serves(&self, webhook: Webhook) -> bool {
        match webhook {
            Webhook::SyncFinalizer => self.serving.guard,
            Webhook::MoveWindow | Webhook::LeaseHold => self.serving.pin,
        }
    }
}

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
    fn allow(req: &AdmissionRequest, reason: Reason) -> Self {
        Decision {
            response: AdmissionResponse::allow(&req.uid),
            verdict: Verdict::Allow,
            reason,
            detail: String::new(),
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

/// Decide one request for `webhook`, delivered as the rule's enforcement mode and the
/// exemptions in force say.
pub async fn decide(state: &State, webhook: Webhook, req: &AdmissionRequest) -> Decision {
    decide_by(state, webhook, req, None).await
}

/// `decide`, finishing by `deadline`: a read the pin would wait on is cut short so that the
/// pure rule decides on "unknown" rather than the deadline deciding for it (an app's scale-up
/// must pass, whatever handoff could not read in time).
pub async fn decide_by(
    state: &State,
    webhook: Webhook,
    req: &AdmissionRequest,
    deadline: Option<tokio::time::Instant>,
) -> Decision {
    let decided = match webhook {
        Webhook::SyncFinalizer => decide_sync_finalizer(state, req).await,
        Webhook::MoveWindow => decide_move_window(state, req, deadline).await,
        Webhook::LeaseHold => decide_lease_hold(req),
    };
    deliver(&state.rollout(), webhook, req, decided)
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

async fn decide_move_window(
    state: &State,
    req: &AdmissionRequest,
    deadline: Option<tokio::time::Instant>,
) -> Decision {
    let Some(pin) = PinRequest::from_review(req) else {
        return Decision::allow(req, Reason::Pin(PinReason::NotApplicable));
    };
    let snap = state.windows.snapshot();
    let view = WindowView::new(
        &snap.open,
        &snap.invalid,
        &snap.pinned,
        state.windows_unseen(),
    );
    let (lookup, stale);
    let pin = match pin.parent_to_read(&view) {
        None => pin,
        Some((namespace, name)) => {
            lookup = state.deployment(namespace, name, deadline).await;
            stale = state
                .health
                .deployments
                .stale("Deployment", state.stale_after);
            pin.with_parent(lookup.parent(stale.as_deref()))
        }
    };
    match move_window::decide(&pin, &view, &state.own) {
        PinVerdict::Allow(reason) => Decision::allow(req, Reason::Pin(reason)),
        PinVerdict::Deny { reason, message } => Decision::deny(req, Reason::Pin(reason), message),
        PinVerdict::Pin {
            ops,
            warning,
            reason,
            ..
        } => {
            let reason = Reason::Pin(reason);
            let mut response = AdmissionResponse::allow(&req.uid).with_patch(&ops);
            response.warnings.push(warning.clone());
            response.audit_annotations = audit(Verdict::Patch, reason);
            Decision {
                response,
                verdict: Verdict::Patch,
                reason,
                detail: warning,
            }
        }
    }
}

/// Everything the rule reads is on the stored Lease (`oldObject`): no state, never in doubt.
fn decide_lease_hold(req: &AdmissionRequest) -> Decision {
    let Some(write) = LeaseWrite::from_review(req) else {
        return Decision::allow(req, Reason::Lease(LeaseReason::NotApplicable));
    };
    let verdict = lease_hold::decide(&write);
    let reason = Reason::Lease(verdict.reason());
    match verdict {
        LeaseVerdict::Allow(_) => Decision::allow(req, reason),
        LeaseVerdict::Deny { message } => Decision::deny(req, reason, message),
    }
}

async fn decide_sync_finalizer(state: &State, req: &AdmissionRequest) -> Decision {
    let Some(delete) = DeleteRequest::from_review(req) else {
        return Decision::allow(req, Reason::GuardAllow(AllowReason::NotDelete));
    };
    let server = state.kcp.as_ref().map_or("", |k| k.server.as_str());
    let decide_on = |lookup: &NamespaceLookup, kcp: &KcpRead, fresh| {
        let (ns, kcp) = (lookup.state(), kcp.state(server));
        sync_finalizer::decide_with_kcp(&delete, ns, kcp, fresh, &state.ids)
    };
    // Only a sync target (or what looks like one) has a namespace to read; everyone else is
    // decided without reading anything, here or in kcp.
    let Some(ns) = delete.namespace_to_read(&state.ids) else {
        let plain = decide_on(
            &NamespaceLookup::Plain,
            &KcpRead::NotRead,
            Freshness::Proven,
        );
        return guard(req, plain);
    };
    let (lookup, read_now) = state.namespace(ns).await;
    // The kcp namespace the locator names, when handoff reads kcp: never older than
    // --max-staleness, and unreadable denies.
    let kcp = state.kcp_namespace(&lookup).await;
    let unproven = if read_now {
        None
    } else {
        state.namespaces_unproven()
    };
    let fresh = match unproven {
        Some(_) => Freshness::Unproven,
        None => Freshness::Proven,
    };
    let first = decide_on(&lookup, &kcp, fresh);
    let (GuardVerdict::ReadAgain, Some(why)) = (&first, unproven) else {
        return guard(req, first);
    };
    let lookup = match state.read_namespace(ns).await {
        NamespaceLookup::Unavailable(e) => {
            NamespaceLookup::Unavailable(format!("{why}, and reading namespace {ns} failed: {e}"))
        }
        read => read,
    };
    // The fresh view may name another kcp namespace (or none); the kcp side answers from its
    // own fresh view.
    let kcp = state.kcp_namespace(&lookup).await;
    guard(req, decide_on(&lookup, &kcp, Freshness::Proven))
}

fn guard(req: &AdmissionRequest, v: GuardVerdict) -> Decision {
    match v {
        GuardVerdict::Allow(r) => Decision::allow(req, Reason::GuardAllow(r)),
        GuardVerdict::Deny { rule, message } => {
            Decision::deny(req, Reason::GuardDeny(rule), message)
        }
        GuardVerdict::ReadAgain => unreachable!("a view read just now is proven"),
    }
}
