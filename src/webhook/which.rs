//! Which webhook a request is for: by path when served, by the request itself when
//! `handoff review` is given one without `--webhook`.

use crate::admission::{AdmissionRequest, Operation};
use crate::rules::lease_hold;
use crate::state::State;

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
    pub const ALL: [Webhook; 3] = [
        Webhook::SyncFinalizer,
        Webhook::MoveWindow,
        Webhook::LeaseHold,
    ];

    /// Where it is served.
    pub fn path(self) -> &'static str {
        match self {
            Webhook::SyncFinalizer => "/validate/sync-finalizer",
            Webhook::MoveWindow => "/mutate/move-window",
            Webhook::LeaseHold => "/validate/lease-hold",
        }
    }

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
