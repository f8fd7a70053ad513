//! The edge between a decoded AdmissionReview and the pure policies: pick the webhook, read
//! the state it needs, call the policy, shape the response. Shared by `serve` and `review`.

use std::collections::BTreeMap;

use crate::admission::{AdmissionRequest, AdmissionResponse, Operation};
use crate::policy::lease_hold;
use crate::policy::move_window::{
    self, Doubt, OpenWindow, ParentDeployment, PinRequest, PinTarget, PinVerdict, WindowView,
};
use crate::policy::rollout::{self, Delivery, Rollout, RuleOutcome};
use crate::policy::sync_finalizer::{self, DeleteRequest, KcpState, NamespaceState, Verdict};
use crate::state::{DeploymentLookup, KcpRead, NamespaceLookup, State};

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

/// A decision, ready to send and to log.
#[derive(Debug, Clone)]
pub struct Decision {
    pub response: AdmissionResponse,
    /// `allow`, `deny` or `patch`.
    pub verdict: &'static str,
    /// Machine-readable reason (the rule that decided).
    pub reason: &'static str,
    /// Human-readable detail for the log: the denial message or the pin.
    pub detail: String,
}

impl Decision {
    fn allow(req: &AdmissionRequest, reason: &'static str) -> Self {
        Decision {
            response: AdmissionResponse::allow(&req.uid),
            verdict: "allow",
            reason,
            detail: String::new(),
        }
    }

    /// A denial with a message, also recorded as audit annotations (the API server prefixes
    /// the keys with the webhook's name).
    pub fn deny(req: &AdmissionRequest, reason: &'static str, message: String) -> Self {
        let message = crate::policy::one_line(message);
        let mut response = AdmissionResponse::deny(&req.uid, 403, "Forbidden", message.clone());
        response.audit_annotations = audit("deny", reason);
        Decision {
            response,
            verdict: "deny",
            reason,
            detail: message,
        }
    }
}

pub fn audit(verdict: &str, reason: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("decision".to_string(), verdict.to_string()),
        ("reason".to_string(), reason.to_string()),
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
    let outcome = match d.verdict {
        "deny" => RuleOutcome::Deny,
        "patch" => RuleOutcome::Patch,
        _ => RuleOutcome::Allow,
    };
    let exemption = rollout.exemption(&req.user_info.username, &req.user_info.groups);
    let delivery = rollout::deliver(outcome, mode, exemption.is_some());
    let would = match outcome {
        RuleOutcome::Patch => "pin this",
        _ => "deny this request",
    };
    let warning = match (&delivery, exemption) {
        (Delivery::AsDecided, _) => return d,
        (Delivery::Warn { .. }, _) => Some(format!(
            "handoff would {would} ({} is in warn mode): {}",
            webhook.as_str(),
            d.detail
        )),
        (Delivery::Audit { .. }, _) => None,
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
        reason: d.reason,
        detail: d.detail,
    }
}

async fn decide_move_window(
    state: &State,
    req: &AdmissionRequest,
    deadline: Option<tokio::time::Instant>,
) -> Decision {
    let is_deployments = req.resource.group == "apps" && req.resource.resource == "deployments";
    let sub = req.sub_resource.as_deref().unwrap_or("");
    let scale = match (is_deployments, sub, req.operation) {
        (true, "", Operation::Create | Operation::Update) => false,
        (true, "scale", Operation::Update) => true,
        _ => return Decision::allow(req, "not-applicable"),
    };
    let snap = state.windows.snapshot();
    // Windows handoff cannot see: not listed yet, or the watch has gone stale. Then the last
    // known windows only tell what could be selected; they pin nothing on their own.
    let unseen = if state.windows.is_synced() {
        state.health.windows.stale("MoveWindow", state.stale_after)
    } else {
        Some("handoff has not yet read the MoveWindows from the API server".to_string())
    };
    let doubt = match &unseen {
        Some(why) => Some(("state-unavailable", why.clone())),
        None if !snap.invalid.is_empty() => Some(("invalid-window", snap.invalid.join("; "))),
        None => None,
    };
    let could_select: Vec<OpenWindow> = match &unseen {
        Some(_) => std::iter::once(default_window().clone())
            .chain(snap.open.iter().map(|w| OpenWindow {
                name: format!("the last known selector of MoveWindow \"{}\"", w.name),
                selector: w.selector.clone(),
            }))
            .collect(),
        None => Vec::new(),
    };
    let view = WindowView {
        open: if unseen.is_some() { &[] } else { &snap.open },
        pinned: &snap.pinned,
        doubt: doubt.as_ref().map(|(reason, why)| Doubt {
            reason,
            why,
            could_select: if unseen.is_some() {
                &could_select
            } else {
                std::slice::from_ref(default_window())
            },
        }),
    };
    if view.open.is_empty() && view.doubt.is_none() {
        return Decision::allow(req, "no-open-window");
    }
    let Some(object) = req.object.as_ref() else {
        return Decision::deny(
            req,
            "no-object",
            format!(
                "{} of {} carries no object to pin",
                req.operation.as_str(),
                req.resource_path()
            ),
        );
    };
    let namespace = req
        .namespace
        .as_deref()
        .or(object.metadata.namespace.as_deref())
        .unwrap_or("");
    let name = req.object_name().unwrap_or("");
    let lookup;
    let parent_stale;
    let target = if scale {
        // Leave time to answer: 50 ms before the deadline the read gives up as "unavailable".
        let budget = deadline.map_or(state.api_timeout, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
                .saturating_sub(std::time::Duration::from_millis(50))
                .min(state.api_timeout)
        });
        lookup = state.deployment(namespace, name, budget).await;
        parent_stale = state
            .health
            .deployments
            .stale("Deployment", state.stale_after);
        let parent = match &lookup {
            DeploymentLookup::Known(d) => ParentDeployment::Known {
                labels: d.labels.as_ref(),
                annotations: d.annotations.as_ref(),
                stale: parent_stale.as_deref(),
            },
            DeploymentLookup::Missing => ParentDeployment::Missing,
            DeploymentLookup::Unavailable(why) => ParentDeployment::Unavailable(why),
        };
        PinTarget::Scale { object, parent }
    } else {
        PinTarget::Deployment {
            object,
            old_object: req.old_object.as_ref(),
        }
    };
    let pin = PinRequest {
        namespace,
        name,
        target,
    };
    match move_window::decide(&pin, &view, &state.own) {
        PinVerdict::Allow(reason) => Decision::allow(req, reason),
        PinVerdict::Deny { reason, message } => Decision::deny(req, reason, message),
        PinVerdict::Pin {
            ops,
            warning,
            reason,
            ..
        } => {
            let mut response = AdmissionResponse::allow(&req.uid).with_patch(&ops);
            response.warnings.push(warning.clone());
            response.audit_annotations = audit("pin", reason);
            Decision {
                response,
                verdict: "patch",
                reason,
                detail: warning,
            }
        }
    }
}

/// Everything the rule reads is on the stored Lease (`oldObject`): no state, never in doubt.
fn decide_lease_hold(req: &AdmissionRequest) -> Decision {
    let is_lease = req.resource.group == "coordination.k8s.io"
        && req.resource.resource == "leases"
        && req.sub_resource.as_deref().unwrap_or("").is_empty();
    if !is_lease {
        return Decision::allow(req, "not-applicable");
    }
    let old = req.old_object.as_ref().map(|o| &o.metadata);
    let write = lease_hold::LeaseWrite {
        operation: req.operation,
        username: &req.user_info.username,
        namespace: req.namespace.as_deref().unwrap_or(""),
        name: req.object_name().unwrap_or(""),
        old_labels: old.and_then(|m| m.labels.as_ref()),
        old_annotations: old.and_then(|m| m.annotations.as_ref()),
    };
    match lease_hold::decide(&write) {
        lease_hold::LeaseVerdict::Allow(reason) => Decision::allow(req, reason),
        lease_hold::LeaseVerdict::Deny { reason, message } => Decision::deny(req, reason, message),
    }
}

async fn decide_sync_finalizer(state: &State, req: &AdmissionRequest) -> Decision {
    let Some(delete) = DeleteRequest::from_review(req) else {
        return Decision::allow(req, sync_finalizer::AllowReason::NotDelete.as_str());
    };
    let decide_on = |lookup: &NamespaceLookup, kcp: &KcpRead| {
        let ns_state = match lookup {
            NamespaceLookup::Relevant(m) => NamespaceState::Known(m),
            NamespaceLookup::Plain => NamespaceState::Plain,
            NamespaceLookup::Unavailable(why) => NamespaceState::Unavailable(why),
        };
        let server = state.kcp.as_ref().map_or("", |k| k.server.as_str());
        let kcp_state = match kcp {
            KcpRead::NotRead => KcpState::NotRead,
            KcpRead::Known { at, view } => KcpState::Known {
                at,
                holds: &view.holds,
                server,
            },
            KcpRead::Unavailable { at, why } => KcpState::Unavailable {
                at: at.as_ref(),
                why,
            },
        };
        sync_finalizer::decide_with_kcp(&delete, ns_state, kcp_state, &state.ids)
    };
    // Only a sync target (or what looks like one) has a namespace to read; everyone else is
    // decided without reading anything, here or in kcp.
    let Some(ns) = delete.namespace_to_read(&state.ids) else {
        return verdict(req, decide_on(&NamespaceLookup::Plain, &KcpRead::NotRead));
    };
    let (lookup, fresh) = state.namespace(ns).await;
    // The kcp namespace the locator names, when handoff reads kcp: never older than
    // --max-staleness, and unreadable denies.
    let kcp = state.kcp_namespace(&lookup).await;
    let first = decide_on(&lookup, &kcp);
    // Never allow a sync target's delete on a view that cannot be shown to be current
    // (DESIGN §1.3): read the namespace now and decide on that.
    let unproven = match first.is_allowed() && !fresh {
        true => state.namespaces_unproven(),
        false => None,
    };
    let Some(why) = unproven else {
        return verdict(req, first);
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
    verdict(req, decide_on(&lookup, &kcp))
}

fn verdict(req: &AdmissionRequest, v: Verdict) -> Decision {
    match v {
        v @ Verdict::Allow(_) => Decision::allow(req, v.reason()),
        Verdict::Deny { rule, message } => Decision::deny(req, rule.as_str(), message),
    }
}

/// Cluster API's provider controllers: what a window handoff cannot see would most likely pin.
fn default_window() -> &'static OpenWindow {
    static DEFAULT: std::sync::LazyLock<OpenWindow> = std::sync::LazyLock::new(|| OpenWindow {
        name: "the Cluster API default selector".into(),
        selector: crate::resources::move_window::MoveWindowSpec::default_selector(),
    });
    &DEFAULT
}
