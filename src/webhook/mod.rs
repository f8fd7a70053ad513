//! The edge between a decoded AdmissionReview and the rules: read the state the rule asks
//! for, call the rule, deliver its verdict as the rollout says. Shared by `serve` and
//! `review`. Which webhook a request is for is `which`; how a verdict leaves is `decision`.

mod decision;
mod which;

pub use decision::{Decision, Reason, deliver};
pub use which::Webhook;

use crate::admission::AdmissionRequest;
use crate::rules::lease_hold::{self, LeaseReason, LeaseVerdict, LeaseWrite};
use crate::rules::move_window::{self, PinReason, PinRequest, PinVerdict, WindowView};
use crate::rules::sync_finalizer::{
    self, AllowReason, DeleteRequest, Freshness, GuardVerdict, Rule,
};
use crate::state::{KcpRead, NamespaceLookup, State};

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

async fn decide_move_window(
    state: &State,
    req: &AdmissionRequest,
    deadline: Option<tokio::time::Instant>,
) -> Decision {
    let Some(pin) = PinRequest::from_review(req) else {
        return Decision::allow(req, Reason::Pin(PinReason::NotApplicable));
    };
    let (snap, unseen) = state.windows_view(deadline).await;
    let view = WindowView::new(&snap.open, &snap.invalid, &snap.pinned, unseen);
    let (lookup, stale);
    let pin = match pin.parent_to_read(&view) {
        None => pin,
        Some((namespace, name)) => {
            (lookup, stale) = state.deployment(namespace, name, deadline).await;
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
            Decision::pin(req, reason, &ops, warning)
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
        // The rule asks again only on an unproven view, and the second call is on a view read
        // just now; should that ever change, the delete is held, with the reason, not a panic.
        GuardVerdict::ReadAgain => Decision::deny(
            req,
            Reason::GuardDeny(Rule::StateUnavailable),
            "handoff could not prove its view of the namespace fresh; the delete is held until it can".into(),
        ),
    }
}
