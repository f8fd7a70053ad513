//! The move-window pin (docs/ARCHITECTURE.md §1.2): a pure function from a Deployment write (or a scale
//! request), the open windows and the parent Deployment's labels to a JSONPatch.

use std::collections::BTreeMap;
use std::fmt;

use crate::admission::{AdmissionRequest, ObjectView, Operation, PatchOp, pointer};
use crate::rules::selector::Selector;

/// Where the count a Deployment asked for is kept while it is pinned.
pub const SAVED_REPLICAS_ANNOTATION: &str = "handoff.dev/replicas-before-move";

/// The replica count a pinned Deployment will be restored to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SavedReplicas(pub i32);

impl SavedReplicas {
    /// A non-negative integer; anything else is unreadable.
    pub fn parse(s: &str) -> Option<Self> {
        s.trim()
            .parse::<i32>()
            .ok()
            .filter(|n| *n >= 0)
            .map(SavedReplicas)
    }

    pub fn from_annotations(a: Option<&BTreeMap<String, String>>) -> Option<Self> {
        a.and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION))
            .and_then(|v| Self::parse(v))
    }
}

impl fmt::Display for SavedReplicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An open MoveWindow, as the pin needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenWindow {
    pub name: String,
    pub selector: Selector,
}

/// The namespace the manifests install handoff into.
pub const HANDOFF_NAMESPACE: &str = "handoff-system";
/// The pin's Deployment there (and its Service), as the manifests deploy it.
pub const PIN_DEPLOYMENT: &str = "handoff-pin";
/// The guard's Deployment there (and its Service).
pub const GUARD_DEPLOYMENT: &str = "handoff-guard";

/// handoff's own Deployment, which is never pinned (it serves the webhook that would unpin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnDeployment {
    pub namespace: String,
    pub name: String,
}

/// The pin's Deployment as the manifests deploy it.
impl Default for OwnDeployment {
    fn default() -> Self {
        OwnDeployment {
            namespace: HANDOFF_NAMESPACE.into(),
            name: PIN_DEPLOYMENT.into(),
        }
    }
}

impl std::fmt::Display for OwnDeployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the edge knows of the Deployment behind a scale request.
#[derive(Debug, Clone, Copy)]
pub enum ParentDeployment<'a> {
    /// Not looked up: `PinRequest::parent_to_read` said the decision does not need it.
    NotRead,
    Known {
        labels: Option<&'a BTreeMap<String, String>>,
        annotations: Option<&'a BTreeMap<String, String>>,
        /// Set when these come from a cache whose watch has been failing: the labels may be
        /// out of date, so a window's list of pinned Deployments counts too.
        stale: Option<&'a str>,
    },
    /// No such Deployment: the API server will answer the scale with 404 anyway.
    Missing,
    /// Neither cached nor readable now.
    Unavailable(&'a str),
}

/// A Deployment that a MoveWindow's status lists as pinned (`status.pinned[]`), readable even
/// when the window's selector or the Deployment's labels are not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedRef {
    pub window: String,
    pub namespace: String,
    pub name: String,
    /// The window stops it by holding its leader-election Lease: its replicas keep running
    /// (they serve its webhooks) and its writes are never pinned to 0.
    pub lease_stopped: bool,
}

/// Why handoff cannot see every MoveWindow now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unseen {
    /// The watch has not listed them yet.
    NotListed,
    /// The watch has failed and the windows could not be read now, or it has been failing past
    /// `--stale-after`: the windows last seen are all there is.
    Stale(String),
}

/// Why the pin may not see every open window, and what such a window could select.
#[derive(Debug, Clone)]
struct Doubt<'a> {
    /// `StateUnavailable` or `InvalidWindow`.
    reason: PinReason,
    why: String,
    /// Besides the Cluster API default: the selectors of the windows last seen open, which a
    /// stale watch can no longer vouch for.
    last_known: &'a [OpenWindow],
}

impl Doubt<'_> {
    /// The selectors a window handoff cannot see could have, each named for the message.
    fn could_select(&self) -> impl Iterator<Item = (String, &Selector)> {
        std::iter::once((
            "the Cluster API default selector".to_string(),
            // Cluster API's provider controllers: what a window handoff cannot see would most
            // likely pin.
            crate::rules::selector::default_selector(),
        ))
        .chain(self.last_known.iter().map(|w| {
            (
                format!("the last known selector of MoveWindow \"{}\"", w.name),
                &w.selector,
            )
        }))
    }
}

/// What handoff knows of the MoveWindows when a write arrives (docs/ARCHITECTURE.md §1.3).
#[derive(Debug, Clone)]
pub struct WindowView<'a> {
    /// Open windows it has read and can trust.
    open: &'a [OpenWindow],
    /// Deployments that open (or possibly open) windows list as pinned.
    pinned: &'a [PinnedRef],
    /// Set while windows may be open that `open` does not show.
    doubt: Option<Doubt<'a>>,
}

impl<'a> WindowView<'a> {
    /// A complete view: exactly these windows are open.
    pub fn known(open: &'a [OpenWindow]) -> Self {
        WindowView {
            open,
            pinned: &[],
            doubt: None,
        }
    }

    /// The view of what the MoveWindow cache holds: the open windows, the open ones whose
    /// selector does not parse (as messages) and the Deployments they list as pinned, and
    /// whether the cache can be seen to be complete. Windows handoff cannot see turn the last
    /// known ones into what could be selected: they pin nothing on their own.
    pub fn new(
        open: &'a [OpenWindow],
        invalid: &[String],
        pinned: &'a [PinnedRef],
        unseen: Option<Unseen>,
    ) -> Self {
        let (open, doubt) = match unseen {
            None if invalid.is_empty() => (open, None),
            None => (
                open,
                Some(Doubt {
                    reason: PinReason::InvalidWindow,
                    why: invalid.join("; "),
                    last_known: &[],
                }),
            ),
            Some(unseen) => (
                &[][..],
                Some(Doubt {
                    reason: PinReason::StateUnavailable,
                    why: match unseen {
                        Unseen::NotListed => {
                            "handoff has not yet read the MoveWindows from the API server".into()
                        }
                        Unseen::Stale(why) => why,
                    },
                    last_known: open,
                }),
            ),
        };
        WindowView {
            open,
            pinned,
            doubt,
        }
    }

    /// Whether no window is open, nor could be.
    fn is_empty(&self) -> bool {
        self.open.is_empty() && self.doubt.is_none()
    }
}

/// A write the pin may change, read from the AdmissionReview.
#[derive(Debug, Clone, Copy)]
pub enum PinTarget<'a> {
    /// CREATE or UPDATE of `apps/v1 deployments`.
    Deployment {
        object: &'a ObjectView,
        old_object: Option<&'a ObjectView>,
    },
    /// UPDATE of `deployments/scale` (an `autoscaling/v1 Scale`).
    Scale {
        object: &'a ObjectView,
        parent: ParentDeployment<'a>,
    },
    /// Either, sent without its object: nothing to pin.
    NoObject { operation: Operation, scale: bool },
}

#[derive(Debug, Clone, Copy)]
pub struct PinRequest<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub target: PinTarget<'a>,
}

impl<'a> PinRequest<'a> {
    /// `None` when the request is not a write the pin reads. A scale request's parent is
    /// `NotRead`, until the edge reads the one `parent_to_read` names.
    pub fn from_review(req: &'a AdmissionRequest) -> Option<Self> {
        if req.resource.group != "apps" || req.resource.resource != "deployments" {
            return None;
        }
        let scale = match (req.sub_resource.as_deref().unwrap_or(""), req.operation) {
            ("", Operation::Create | Operation::Update) => false,
            ("scale", Operation::Update) => true,
            _ => return None,
        };
        let object = req.object.as_ref();
        let namespace = req
            .namespace
            .as_deref()
            .or(object.and_then(|o| o.metadata.namespace.as_deref()))
            .unwrap_or("");
        let target = match object {
            None => PinTarget::NoObject {
                operation: req.operation,
                scale,
            },
            Some(object) if scale => PinTarget::Scale {
                object,
                parent: ParentDeployment::NotRead,
            },
            Some(object) => PinTarget::Deployment {
                object,
                old_object: req.old_object.as_ref(),
            },
        };
        Some(PinRequest {
            namespace,
            name: req.object_name().unwrap_or(""),
            target,
        })
    }

    /// The Deployment (namespace, name) whose labels decide a scale request, when a window is
    /// open or could be: only then is it read.
    pub fn parent_to_read(&self, view: &WindowView<'_>) -> Option<(&'a str, &'a str)> {
        match self.target {
            PinTarget::Scale { .. } if !view.is_empty() => Some((self.namespace, self.name)),
            _ => None,
        }
    }

    /// This request, with the parent of its scale as the edge found it.
    pub fn with_parent<'b>(self, parent: ParentDeployment<'b>) -> PinRequest<'b>
    where
        'a: 'b,
    {
        let target = match self.target {
            PinTarget::Scale { object, .. } => PinTarget::Scale { object, parent },
            other => other,
        };
        PinRequest { target, ..self }
    }
}

/// Why the pin decided as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinReason {
    /// Not a write of a Deployment or its scale.
    NotApplicable,
    NoOpenWindow,
    /// A write the API server sent without its object, refused while a window is open.
    NoObject,
    /// handoff's own Deployment.
    OwnDeployment,
    /// A Deployment a window stops by its Lease, never pinned.
    LeaseStopped,
    NotSelected,
    /// The scale's Deployment does not exist.
    NoSuchDeployment,
    /// The scale's Deployment could not be read, and no window lists it as pinned.
    ParentUnknownNotPinned,
    /// A negative count, for the API server's validation to reject.
    InvalidReplicas,
    Pinned,
    /// Pinned, leaving its unreadable saved count for `window close` to report.
    PinnedUnreadableCount,
    PinnedScale,
    /// A window handoff cannot see, or a Deployment it cannot read, could select it.
    StateUnavailable,
    /// An open window whose selector does not parse could select it.
    InvalidWindow,
}

impl PinReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PinReason::NotApplicable => "not-applicable",
            PinReason::NoOpenWindow => "no-open-window",
            PinReason::NoObject => "no-object",
            PinReason::OwnDeployment => "own-deployment",
            PinReason::LeaseStopped => "lease-stopped",
            PinReason::NotSelected => "not-selected",
            PinReason::NoSuchDeployment => "no-such-deployment",
            PinReason::ParentUnknownNotPinned => "parent-unknown-not-pinned",
            PinReason::InvalidReplicas => "invalid-replicas",
            PinReason::Pinned => "pinned",
            PinReason::PinnedUnreadableCount => "pinned-unreadable-count",
            PinReason::PinnedScale => "pinned-scale",
            PinReason::StateUnavailable => "state-unavailable",
            PinReason::InvalidWindow => "invalid-window",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum PinVerdict {
    Allow(PinReason),
    Pin {
        window: String,
        ops: Vec<PatchOp>,
        restore_to: SavedReplicas,
        warning: String,
        reason: PinReason,
    },
    Deny {
        reason: PinReason,
        message: String,
    },
}

/// Decide one write. Idempotent: a request that is already pinned gets no patch operations.
///
/// Only a write that a window selects is pinned, and only one that a window *could* select is
/// refused while handoff cannot see every window or the parent of a Scale (docs/ARCHITECTURE.md §1.3):
/// everything else passes, whatever handoff's caches know.
pub fn decide(req: &PinRequest<'_>, view: &WindowView<'_>, own: &OwnDeployment) -> PinVerdict {
    if view.is_empty() {
        return PinVerdict::Allow(PinReason::NoOpenWindow);
    }
    if let PinTarget::NoObject { operation, scale } = req.target {
        return PinVerdict::Deny {
            reason: PinReason::NoObject,
            message: format!(
                "{} of deployments.apps{} carries no object to pin",
                operation.as_str(),
                if scale { "/scale" } else { "" }
            ),
        };
    }
    if req.namespace == own.namespace && req.name == own.name {
        return PinVerdict::Allow(PinReason::OwnDeployment);
    }
    // Pinning a Lease-stopped controller to 0 would take down the webhooks the Lease strategy
    // keeps serving. Only while every window is known: in doubt, the refusal below is safer.
    if view.doubt.is_none()
        && view
            .pinned
            .iter()
            .any(|p| p.lease_stopped && p.namespace == req.namespace && p.name == req.name)
    {
        return PinVerdict::Allow(PinReason::LeaseStopped);
    }
    let what = format!("{}/{}", req.namespace, req.name);
    match req.target {
        PinTarget::NoObject { .. } => unreachable!("refused above"),
        PinTarget::Deployment { object, old_object } => {
            let labels = object.metadata.labels.as_ref();
            match view.open.iter().find(|w| w.selector.matches(labels)) {
                Some(w) => pin_deployment(w, &what, object, old_object),
                None => refuse_if_could_be_pinned(req, view, Some(labels), None, &what)
                    .unwrap_or(PinVerdict::Allow(PinReason::NotSelected)),
            }
        }
        PinTarget::Scale { object, parent } => {
            let (labels, annotations, parent_doubt) = match parent {
                ParentDeployment::Known {
                    labels,
                    annotations,
                    stale,
                } => (Some(labels), annotations, stale),
                ParentDeployment::Missing => return PinVerdict::Allow(PinReason::NoSuchDeployment),
                ParentDeployment::Unavailable(why) => (None, None, Some(why)),
                // The edge reads what `parent_to_read` names; unread, it is as unknown.
                ParentDeployment::NotRead => (None, None, Some("handoff did not read it")),
            };
            let selected = labels.and_then(|l| view.open.iter().find(|w| w.selector.matches(l)));
            match selected {
                Some(w) => pin_scale(w, &what, object, annotations),
                None => refuse_if_could_be_pinned(req, view, labels, parent_doubt, &what)
                    .unwrap_or(PinVerdict::Allow(if labels.is_some() {
                        PinReason::NotSelected
                    } else {
                        PinReason::ParentUnknownNotPinned
                    })),
            }
        }
    }
}

/// A refusal when a window handoff cannot see, or cannot evaluate, could select this
/// Deployment: by the Cluster API default or a last known selector (when its labels are
/// known), or by a window's list of pinned Deployments (when the windows or the labels are in
/// doubt). `None`: nothing could select it, so it passes.
fn refuse_if_could_be_pinned(
    req: &PinRequest<'_>,
    view: &WindowView<'_>,
    labels: Option<Option<&BTreeMap<String, String>>>,
    parent_doubt: Option<&str>,
    what: &str,
) -> Option<PinVerdict> {
    if let (Some(d), Some(labels)) = (&view.doubt, labels)
        && let Some((selector, _)) = d.could_select().find(|(_, s)| s.matches(labels))
    {
        return Some(PinVerdict::Deny {
            reason: d.reason,
            message: format!(
                "{}; Deployment {what} matches {selector}, so handoff cannot tell whether it must stay at 0 replicas and refuses the write until it can (retry in a moment)",
                d.why
            ),
        });
    }
    let why = match (&view.doubt, parent_doubt) {
        (Some(d), _) => (d.reason, d.why.clone()),
        (None, Some(w)) => (
            PinReason::StateUnavailable,
            format!("handoff cannot read its labels now ({w})"),
        ),
        (None, None) => return None,
    };
    let p = view
        .pinned
        .iter()
        .find(|p| p.namespace == req.namespace && p.name == req.name)?;
    Some(PinVerdict::Deny {
        reason: why.0,
        message: format!(
            "MoveWindow \"{}\" lists Deployment {what} as pinned, and {}; the write is refused rather than risk starting a controller mid-move (retry in a moment)",
            p.window, why.1
        ),
    })
}

fn pin_deployment(
    w: &OpenWindow,
    what: &str,
    object: &ObjectView,
    old_object: Option<&ObjectView>,
) -> PinVerdict {
    let asked = object.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    if asked < 0 {
        // Mutation runs before validation: pinning would turn an invalid write into a
        // valid one. Leave it for the API server to reject.
        return PinVerdict::Allow(PinReason::InvalidReplicas);
    }
    let present = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SAVED_REPLICAS_ANNOTATION));
    // `Some` = the count to keep; `None` = leave an unreadable annotation alone, for
    // `handoff window close` to report (it restores such a Deployment to 1).
    let saved = if asked == 0 {
        // Asking for 0 while pinned is what every pinned write looks like; the count
        // to restore stays, even when the client dropped the annotation.
        let readable = SavedReplicas::from_annotations(object.metadata.annotations.as_ref())
            .or_else(|| {
                old_object
                    .and_then(|o| SavedReplicas::from_annotations(o.metadata.annotations.as_ref()))
            });
        match (readable, present) {
            (Some(s), _) => Some(s),
            (None, Some(_)) => None,
            (None, None) => Some(SavedReplicas(0)),
        }
    } else {
        Some(SavedReplicas(asked))
    };
    let mut ops = Vec::with_capacity(2);
    match object.spec.as_ref() {
        None => ops.push(PatchOp::Add {
            path: "/spec".into(),
            value: serde_json::json!({ "replicas": 0 }),
        }),
        Some(s) if s.replicas != Some(0) => ops.push(PatchOp::Add {
            path: "/spec/replicas".into(),
            value: 0.into(),
        }),
        Some(_) => {}
    }
    let Some(saved) = saved else {
        return PinVerdict::Pin {
            warning: format!(
                "MoveWindow \"{}\" pins Deployment {what} to 0 replicas; its {SAVED_REPLICAS_ANNOTATION} annotation {:?} is unreadable, so it will be restored to 1 when the window closes unless you set it",
                w.name,
                present.map(String::as_str).unwrap_or_default()
            ),
            window: w.name.clone(),
            ops,
            restore_to: SavedReplicas(1),
            reason: PinReason::PinnedUnreadableCount,
        };
    };
    let saved_text = saved.to_string();
    match object.metadata.annotations.as_ref() {
        None => ops.push(PatchOp::Add {
            path: "/metadata/annotations".into(),
            value: serde_json::json!({ SAVED_REPLICAS_ANNOTATION: saved_text }),
        }),
        Some(a) if a.get(SAVED_REPLICAS_ANNOTATION) != Some(&saved_text) => {
            ops.push(PatchOp::Add {
                path: pointer(&["metadata", "annotations", SAVED_REPLICAS_ANNOTATION]),
                value: saved_text.into(),
            })
        }
        Some(_) => {}
    }
    PinVerdict::Pin {
        warning: format!(
            "MoveWindow \"{}\" pins Deployment {what} to 0 replicas; it will be restored to {saved} when the window closes",
            w.name
        ),
        window: w.name.clone(),
        ops,
        restore_to: saved,
        reason: PinReason::Pinned,
    }
}

fn pin_scale(
    w: &OpenWindow,
    what: &str,
    object: &ObjectView,
    annotations: Option<&BTreeMap<String, String>>,
) -> PinVerdict {
    let asked = object.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    if asked < 0 {
        return PinVerdict::Allow(PinReason::InvalidReplicas);
    }
    let (restore_to, note) = match SavedReplicas::from_annotations(annotations) {
        Some(s) => (s, String::new()),
        None => (
            SavedReplicas(1),
            " (it carries no readable saved count, so 1)".to_string(),
        ),
    };
    let ops = if asked == 0 {
        vec![]
    } else {
        vec![PatchOp::Add {
            path: "/spec/replicas".into(),
            value: 0.into(),
        }]
    };
    let asked_note = if asked > 0 && asked != restore_to.0 {
        format!(
            "; the {asked} asked for is not recorded (annotate {SAVED_REPLICAS_ANNOTATION} to change it)"
        )
    } else {
        String::new()
    };
    PinVerdict::Pin {
        warning: format!(
            "MoveWindow \"{}\" pins Deployment {what} to 0 replicas; it will be restored to {restore_to}{note} when the window closes{asked_note}",
            w.name
        ),
        window: w.name.clone(),
        ops,
        restore_to,
        reason: PinReason::PinnedScale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{ObjectMetaView, SpecView};
    use crate::rules::selector::default_deployment_selector;

    fn capi_labels() -> BTreeMap<String, String> {
        [
            ("clusterctl.cluster.x-k8s.io", ""),
            ("cluster.x-k8s.io/provider", "cluster-api"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn deployment(replicas: Option<i32>, saved: Option<&str>, labels: bool) -> ObjectView {
        ObjectView {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            metadata: ObjectMetaView {
                name: Some("capi-controller-manager".into()),
                namespace: Some("capi-system".into()),
                labels: labels.then(capi_labels),
                annotations: saved.map(|s| {
                    [(SAVED_REPLICAS_ANNOTATION.to_string(), s.to_string())]
                        .into_iter()
                        .collect()
                }),
            },
            spec: Some(SpecView { replicas }),
        }
    }

    fn windows() -> Vec<OpenWindow> {
        vec![OpenWindow {
            name: "capi-move".into(),
            selector: Selector::from_label_selector(&default_deployment_selector()).unwrap(),
        }]
    }

    fn own() -> OwnDeployment {
        OwnDeployment {
            namespace: "handoff-system".into(),
            name: "handoff".into(),
        }
    }

    /// Apply the verdict's patch to the object as JSON and read back (replicas, saved).
    fn apply(obj: &ObjectView, v: &PinVerdict) -> (Option<i64>, Option<String>) {
        let mut json = serde_json::json!({
            "metadata": {},
            "spec": {}
        });
        if let Some(a) = &obj.metadata.annotations {
            json["metadata"]["annotations"] = serde_json::to_value(a).unwrap();
        }
        if let Some(r) = obj.spec.as_ref().and_then(|s| s.replicas) {
            json["spec"]["replicas"] = r.into();
        }
        if let PinVerdict::Pin { ops, .. } = v {
            for op in ops {
                let PatchOp::Add { path, value } = op else {
                    panic!("{op:?}")
                };
                let (parent, last) = path.rsplit_once('/').unwrap();
                let last = last.replace("~1", "/").replace("~0", "~");
                json.pointer_mut(if parent.is_empty() { "" } else { parent })
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .insert(last, value.clone());
            }
        }
        (
            json["spec"]["replicas"].as_i64(),
            json["metadata"]["annotations"][SAVED_REPLICAS_ANNOTATION]
                .as_str()
                .map(str::to_string),
        )
    }

    #[test]
    fn deployment_table() {
        // (case, replicas asked, annotation on object, annotation on oldObject, selected,
        //  want restore_to, want number of patch ops)
        type Row = (
            &'static str,
            Option<i32>,
            Option<&'static str>,
            Option<&'static str>,
            bool,
            Option<i32>,
            usize,
        );
        let rows: &[Row] = &[
            (
                "create asks 3: pinned, 3 saved",
                Some(3),
                None,
                None,
                true,
                Some(3),
                2,
            ),
            (
                "create without replicas means 1",
                None,
                None,
                None,
                true,
                Some(1),
                2,
            ),
            (
                "update asks 5 over a saved 3: 5 saved",
                Some(5),
                Some("3"),
                Some("3"),
                true,
                Some(5),
                2,
            ),
            (
                "update asks 0 with annotation kept",
                Some(0),
                Some("3"),
                Some("3"),
                true,
                Some(3),
                0,
            ),
            (
                "update asks 0, client dropped the annotation: carried from oldObject",
                Some(0),
                None,
                Some("4"),
                true,
                Some(4),
                1,
            ),
            (
                "update asks 0, no saved count anywhere: 0",
                Some(0),
                None,
                None,
                true,
                Some(0),
                1,
            ),
            (
                "unreadable annotation with 0 asked falls back to oldObject",
                Some(0),
                Some("lots"),
                Some("2"),
                true,
                Some(2),
                1,
            ),
            (
                "unreadable everywhere: left alone for close to report, restores to 1",
                Some(0),
                Some("lots"),
                Some("many"),
                true,
                Some(1),
                0,
            ),
            (
                "not selected: untouched",
                Some(3),
                None,
                None,
                false,
                None,
                0,
            ),
        ];
        for (name, asked, ann, old_ann, selected, want, n_ops) in rows {
            let obj = deployment(*asked, *ann, *selected);
            let old = old_ann.map(|a| deployment(Some(0), Some(a), *selected));
            let req = PinRequest {
                namespace: "capi-system",
                name: "capi-controller-manager",
                target: PinTarget::Deployment {
                    object: &obj,
                    old_object: old.as_ref(),
                },
            };
            let v = decide(&req, &WindowView::known(&windows()), &own());
            match (&v, want) {
                (
                    PinVerdict::Pin {
                        restore_to,
                        ops,
                        warning,
                        ..
                    },
                    Some(w),
                ) => {
                    assert_eq!(restore_to.0, *w, "{name}");
                    assert_eq!(ops.len(), *n_ops, "{name}: {ops:?}");
                    assert!(
                        warning.contains("\"capi-move\"")
                            && warning.contains(&format!("restored to {w}")),
                        "{name}: {warning}"
                    );
                    let (replicas, saved) = apply(&obj, &v);
                    assert_eq!(replicas, Some(0), "{name}");
                    // Without annotation ops the annotation stays as it was (an unreadable one
                    // is left for `window close` to report).
                    let want_ann = match (*n_ops, ann) {
                        (0, Some(a)) => a.to_string(),
                        _ => w.to_string(),
                    };
                    assert_eq!(saved.as_deref(), Some(want_ann.as_str()), "{name}");
                    // Idempotent: deciding the patched object again changes nothing.
                    let patched = deployment(Some(0), Some(&want_ann), true);
                    let again = decide(
                        &PinRequest {
                            target: PinTarget::Deployment {
                                object: &patched,
                                old_object: old.as_ref(),
                            },
                            ..req
                        },
                        &WindowView::known(&windows()),
                        &own(),
                    );
                    let PinVerdict::Pin {
                        ops, restore_to, ..
                    } = again
                    else {
                        panic!("{name}: {again:?}")
                    };
                    assert!(ops.is_empty(), "{name}: second call patched {ops:?}");
                    assert_eq!(restore_to.0, *w, "{name}");
                }
                (PinVerdict::Allow(r), None) => assert_eq!(*r, PinReason::NotSelected, "{name}"),
                _ => panic!("{name}: {v:?}"),
            }
        }
    }

    #[test]
    fn annotation_map_is_created_and_keys_escaped() {
        let obj = deployment(Some(2), None, true);
        let req = PinRequest {
            namespace: "capi-system",
            name: "capi-controller-manager",
            target: PinTarget::Deployment {
                object: &obj,
                old_object: None,
            },
        };
        let PinVerdict::Pin { ops, .. } = decide(&req, &WindowView::known(&windows()), &own())
        else {
            panic!()
        };
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            serde_json::json!([
                {"op": "add", "path": "/spec/replicas", "value": 0},
                {"op": "add", "path": "/metadata/annotations", "value": {"handoff.dev/replicas-before-move": "2"}}
            ])
        );
        let mut obj = deployment(Some(2), None, true);
        obj.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
        let req = PinRequest {
            target: PinTarget::Deployment {
                object: &obj,
                old_object: None,
            },
            ..req
        };
        let PinVerdict::Pin { ops, .. } = decide(&req, &WindowView::known(&windows()), &own())
        else {
            panic!()
        };
        assert_eq!(
            serde_json::to_value(&ops[1]).unwrap(),
            serde_json::json!({"op": "add", "path": "/metadata/annotations/handoff.dev~1replicas-before-move", "value": "2"})
        );
    }

    #[test]
    fn no_window_and_own_deployment_pass() {
        let obj = deployment(Some(2), None, true);
        let req = PinRequest {
            namespace: "capi-system",
            name: "capi-controller-manager",
            target: PinTarget::Deployment {
                object: &obj,
                old_object: None,
            },
        };
        assert_eq!(
            decide(&req, &WindowView::known(&[]), &own()),
            PinVerdict::Allow(PinReason::NoOpenWindow)
        );
        let mine = PinRequest {
            namespace: "handoff-system",
            name: "handoff",
            ..req
        };
        assert_eq!(
            decide(&mine, &WindowView::known(&windows()), &own()),
            PinVerdict::Allow(PinReason::OwnDeployment)
        );
    }

    #[test]
    fn a_lease_stopped_deployment_is_never_pinned() {
        let obj = deployment(Some(2), None, true);
        let parent = capi_labels();
        let scale = ObjectView {
            api_version: Some("autoscaling/v1".into()),
            kind: Some("Scale".into()),
            metadata: ObjectMetaView::default(),
            spec: Some(SpecView { replicas: Some(3) }),
        };
        let targets = [
            PinTarget::Deployment {
                object: &obj,
                old_object: None,
            },
            PinTarget::Scale {
                object: &scale,
                parent: ParentDeployment::Known {
                    labels: Some(&parent),
                    annotations: None,
                    stale: None,
                },
            },
        ];
        let open = windows();
        let listed = |lease_stopped: bool, name: &str| PinnedRef {
            window: "capi-move".into(),
            namespace: "capi-system".into(),
            name: name.into(),
            lease_stopped,
        };
        for target in targets {
            let req = PinRequest {
                namespace: "capi-system",
                name: "capi-controller-manager",
                target,
            };
            let by_lease = [listed(true, "capi-controller-manager")];
            let view = WindowView::new(&open, &[], &by_lease, None);
            assert_eq!(
                decide(&req, &view, &own()),
                PinVerdict::Allow(PinReason::LeaseStopped)
            );
            // Listed as pinned by Scale, or another Deployment stopped by Lease: pinned.
            for pinned in [
                [listed(false, "capi-controller-manager")],
                [listed(true, "capi-controller-manager-extra")],
            ] {
                let view = WindowView::new(&open, &[], &pinned, None);
                assert!(
                    matches!(decide(&req, &view, &own()), PinVerdict::Pin { .. }),
                    "{pinned:?}"
                );
            }
            // In doubt the refusal stands: nothing is pinned, nothing unchecked starts.
            let stale = Unseen::Stale("the MoveWindow watch has been failing for 45s".into());
            let doubtful = WindowView::new(&open, &[], &by_lease, Some(stale));
            assert!(matches!(
                decide(&req, &doubtful, &own()),
                PinVerdict::Deny { .. }
            ));
        }
    }

    #[test]
    fn scale_table() {
        let labels = capi_labels();
        let saved: BTreeMap<String, String> =
            [(SAVED_REPLICAS_ANNOTATION.to_string(), "3".to_string())]
                .into_iter()
                .collect();
        let scale = |r: i32| ObjectView {
            api_version: Some("autoscaling/v1".into()),
            kind: Some("Scale".into()),
            metadata: ObjectMetaView::default(),
            spec: Some(SpecView { replicas: Some(r) }),
        };
        let s5 = scale(5);
        let s0 = scale(0);
        // (case, Scale, parent, Ok((restore_to, patch ops)) or Err(reason))
        type Case<'a> = (
            &'a str,
            &'a ObjectView,
            ParentDeployment<'a>,
            Result<(i32, usize), &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "scale of a pinned Deployment is pinned",
                &s5,
                ParentDeployment::Known {
                    labels: Some(&labels),
                    annotations: Some(&saved),
                    stale: None,
                },
                Ok((3, 1)),
            ),
            (
                "scale to 0 needs no patch",
                &s0,
                ParentDeployment::Known {
                    labels: Some(&labels),
                    annotations: Some(&saved),
                    stale: None,
                },
                Ok((3, 0)),
            ),
            (
                "no saved count: restored to 1",
                &s5,
                ParentDeployment::Known {
                    labels: Some(&labels),
                    annotations: None,
                    stale: None,
                },
                Ok((1, 1)),
            ),
            (
                "unselected parent passes",
                &s5,
                ParentDeployment::Known {
                    labels: None,
                    annotations: None,
                    stale: None,
                },
                Err("not-selected"),
            ),
            (
                "missing parent passes",
                &s5,
                ParentDeployment::Missing,
                Err("no-such-deployment"),
            ),
            (
                "unreadable parent that no window lists as pinned passes",
                &s5,
                ParentDeployment::Unavailable("timeout"),
                Err("parent-unknown-not-pinned"),
            ),
        ];
        for (name, obj, parent, want) in cases {
            let req = PinRequest {
                namespace: "capi-system",
                name: "capi-controller-manager",
                target: PinTarget::Scale {
                    object: obj,
                    parent,
                },
            };
            let v = decide(&req, &WindowView::known(&windows()), &own());
            match (&v, want) {
                (
                    PinVerdict::Pin {
                        restore_to,
                        ops,
                        warning,
                        ..
                    },
                    Ok((r, n)),
                ) => {
                    assert_eq!(restore_to.0, r, "{name}");
                    assert_eq!(ops.len(), n, "{name}");
                    assert!(
                        warning.contains(&format!("restored to {r}")),
                        "{name}: {warning}"
                    );
                }
                (PinVerdict::Allow(a), Err(w)) => assert_eq!(a.as_str(), w, "{name}"),
                (PinVerdict::Deny { reason, .. }, Err(w)) => {
                    assert_eq!(reason.as_str(), w, "{name}")
                }
                _ => panic!("{name}: {v:?}"),
            }
        }
    }

    /// The pin under unknown state (docs/ARCHITECTURE.md §1.3): only what a window could select is refused.
    #[test]
    fn unknown_state_table() {
        let capi = capi_labels();
        let app: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        let special: BTreeMap<String, String> = [("app".to_string(), "special".to_string())].into();
        let selector = |s: &str| {
            Selector::from_label_selector(&crate::rules::selector::parse_label_selector(s).unwrap())
                .unwrap()
        };
        // As the cache holds them: a window last seen open, and one open with a selector that
        // does not parse.
        let last_seen = [OpenWindow {
            name: "custom".into(),
            selector: selector("app=special"),
        }];
        let invalid_windows = [
            "MoveWindow \"broken\" is open but its spec.deploymentSelector is invalid".to_string(),
        ];
        let listed = |window: &str, ns: &str, name: &str| PinnedRef {
            window: window.into(),
            namespace: ns.into(),
            name: name.into(),
            lease_stopped: false,
        };
        let open = windows();
        let unread = WindowView::new(&[], &[], &[], Some(Unseen::NotListed));
        let stale_pinned = [listed("custom", "shop", "web")];
        let stale = WindowView::new(
            &last_seen,
            &[],
            &stale_pinned,
            Some(Unseen::Stale(
                "the MoveWindow watch has been failing for 45s".into(),
            )),
        );
        let invalid_pinned = [listed("broken", "shop", "web")];
        let invalid = WindowView::new(&[], &invalid_windows, &invalid_pinned, None);
        let open_pinned = [listed("capi-move", "shop", "web")];
        let trusted = WindowView::new(&open, &[], &open_pinned, None);
        let trusted_and_invalid = WindowView::new(&open, &invalid_windows, &invalid_pinned, None);
        let scale = ObjectView {
            spec: Some(SpecView { replicas: Some(3) }),
            ..ObjectView::default()
        };
        let write = |labels: &BTreeMap<String, String>| ObjectView {
            metadata: ObjectMetaView {
                labels: Some(labels.clone()),
                ..ObjectMetaView::default()
            },
            spec: Some(SpecView { replicas: Some(3) }),
            ..ObjectView::default()
        };
        let (w_capi, w_app, w_special) = (write(&capi), write(&app), write(&special));
        let known = |l| ParentDeployment::Known {
            labels: Some(l),
            annotations: None,
            stale: None,
        };
        let cached = |l| ParentDeployment::Known {
            labels: Some(l),
            annotations: None,
            stale: Some("the Deployment watch has been failing for 45s"),
        };
        let gone = ParentDeployment::Unavailable("the API server did not answer within 3s");
        let dep = |o| PinTarget::Deployment {
            object: o,
            old_object: None,
        };
        let sc = |parent| PinTarget::Scale {
            object: &scale,
            parent,
        };
        // (case, view, namespace/name, target, want: "pin" or an allow/deny reason)
        type Row<'a> = (
            &'a str,
            &'a WindowView<'a>,
            (&'a str, &'a str),
            PinTarget<'a>,
            &'a str,
        );
        let rows: Vec<Row> = vec![
            (
                "unread: a CAPI controller's update is refused",
                &unread,
                ("capi-system", "capi"),
                dep(&w_capi),
                "deny:state-unavailable",
            ),
            (
                "unread: an app's update passes",
                &unread,
                ("shop", "web"),
                dep(&w_app),
                "not-selected",
            ),
            (
                "unread: an app's scale-up passes",
                &unread,
                ("shop", "web"),
                sc(known(&app)),
                "not-selected",
            ),
            (
                "unread: a CAPI controller's scale-up is refused",
                &unread,
                ("capi-system", "capi"),
                sc(known(&capi)),
                "deny:state-unavailable",
            ),
            (
                "unread: a scale-up of an unknown parent passes",
                &unread,
                ("shop", "web"),
                sc(gone),
                "parent-unknown-not-pinned",
            ),
            (
                "stale: a last known selector still refuses",
                &stale,
                ("shop", "special"),
                dep(&w_special),
                "deny:state-unavailable",
            ),
            (
                "stale: a scale of a listed Deployment is refused",
                &stale,
                ("shop", "web"),
                sc(gone),
                "deny:state-unavailable",
            ),
            (
                "stale: a scale of an unlisted unknown parent passes",
                &stale,
                ("shop", "other"),
                sc(gone),
                "parent-unknown-not-pinned",
            ),
            (
                "stale: an app's scale-up passes",
                &stale,
                ("shop", "other"),
                sc(known(&app)),
                "not-selected",
            ),
            (
                "invalid: a Deployment it lists is refused",
                &invalid,
                ("shop", "web"),
                dep(&w_app),
                "deny:invalid-window",
            ),
            (
                "invalid: a CAPI controller is refused",
                &invalid,
                ("capi-system", "capi"),
                dep(&w_capi),
                "deny:invalid-window",
            ),
            (
                "invalid: an unlisted app's scale-up passes",
                &invalid,
                ("shop", "other"),
                sc(known(&app)),
                "not-selected",
            ),
            (
                "open: a listed Deployment whose parent cannot be read is refused",
                &trusted,
                ("shop", "web"),
                sc(gone),
                "deny:state-unavailable",
            ),
            (
                "open: an unlisted unknown parent passes",
                &trusted,
                ("shop", "other"),
                sc(gone),
                "parent-unknown-not-pinned",
            ),
            (
                "open: a selected parent from a stale cache is still pinned",
                &trusted,
                ("capi-system", "capi"),
                sc(cached(&capi)),
                "pin",
            ),
            (
                "open: an unlisted app from a stale cache passes",
                &trusted,
                ("shop", "other"),
                sc(cached(&app)),
                "not-selected",
            ),
            (
                "open: a listed app from a stale cache is refused",
                &trusted,
                ("shop", "web"),
                sc(cached(&app)),
                "deny:state-unavailable",
            ),
            (
                "open: a fresh app parent passes even if listed (labels decide)",
                &trusted,
                ("shop", "web"),
                sc(known(&app)),
                "not-selected",
            ),
            (
                "a known window pins even while another is invalid",
                &trusted_and_invalid,
                ("capi-system", "capi"),
                dep(&w_capi),
                "pin",
            ),
            (
                "own Deployment passes whatever is unknown",
                &unread,
                ("handoff-system", "handoff"),
                dep(&w_capi),
                "own-deployment",
            ),
        ];
        for (case, view, (namespace, name), target, want) in rows {
            let req = PinRequest {
                namespace,
                name,
                target,
            };
            let got = match decide(&req, view, &own()) {
                PinVerdict::Pin { .. } => "pin".to_string(),
                PinVerdict::Allow(r) => r.as_str().to_string(),
                PinVerdict::Deny { reason, message } => {
                    assert!(
                        message.contains(&format!("{namespace}/{name}"))
                            && message.contains("retry"),
                        "{case}: {message}"
                    );
                    format!("deny:{}", reason.as_str())
                }
            };
            assert_eq!(got, want, "{case}");
        }
        // A refusal names the selector that could select the write, and why it is in doubt.
        let says = |view: &WindowView<'_>, (namespace, name), object| match decide(
            &PinRequest {
                namespace,
                name,
                target: dep(object),
            },
            view,
            &own(),
        ) {
            PinVerdict::Deny { message, .. } => message,
            other => panic!("{other:?}"),
        };
        for (view, at, object, parts) in [
            (
                &unread,
                ("capi-system", "capi"),
                &w_capi,
                [
                    "handoff has not yet read the MoveWindows from the API server",
                    "matches the Cluster API default selector",
                ],
            ),
            (
                &stale,
                ("shop", "special"),
                &w_special,
                [
                    "the MoveWindow watch has been failing for 45s",
                    "matches the last known selector of MoveWindow \"custom\"",
                ],
            ),
            (
                &invalid,
                ("shop", "web"),
                &w_app,
                [
                    "MoveWindow \"broken\" lists Deployment shop/web as pinned",
                    "spec.deploymentSelector is invalid",
                ],
            ),
        ] {
            let message = says(view, at, object);
            for part in parts {
                assert!(message.contains(part), "missing {part:?} in {message}");
            }
        }
    }

    fn review(json: serde_json::Value) -> AdmissionRequest {
        let mut body =
            serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        body["request"] = json;
        crate::admission::decode_review(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    #[test]
    fn pin_requests_from_reviews() {
        let deployments =
            serde_json::json!({"group": "apps", "version": "v1", "resource": "deployments"});
        let object = serde_json::json!({"metadata": {"name": "capi", "namespace": "capi-system"}, "spec": {"replicas": 3}});
        // A Deployment write without `namespace` falls back to the object's metadata.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "UPDATE", "name": "capi",
            "resource": deployments, "userInfo": {"username": "u"}, "object": object}),
        );
        let pin = PinRequest::from_review(&r).unwrap();
        assert_eq!((pin.namespace, pin.name), ("capi-system", "capi"));
        assert!(matches!(pin.target, PinTarget::Deployment { .. }));
        // A scale's parent is read only while a window is open or could be.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "UPDATE", "name": "capi",
            "namespace": "capi-system", "resource": deployments, "subResource": "scale",
            "userInfo": {"username": "u"}, "object": {"spec": {"replicas": 3}}}),
        );
        let pin = PinRequest::from_review(&r).unwrap();
        assert!(matches!(
            pin.target,
            PinTarget::Scale {
                parent: ParentDeployment::NotRead,
                ..
            }
        ));
        let open = windows();
        let in_doubt = WindowView::new(&[], &[], &[], Some(Unseen::NotListed));
        assert_eq!(pin.parent_to_read(&WindowView::known(&[])), None);
        for view in [WindowView::known(&open), in_doubt] {
            assert_eq!(pin.parent_to_read(&view), Some(("capi-system", "capi")));
        }
        // Not a write the pin reads: a CREATE of a scale, another resource, a DELETE.
        for (operation, resource, sub) in [
            ("CREATE", deployments.clone(), "scale"),
            ("UPDATE", deployments.clone(), "status"),
            (
                "UPDATE",
                serde_json::json!({"group": "apps", "version": "v1", "resource": "statefulsets"}),
                "",
            ),
            ("DELETE", deployments.clone(), ""),
        ] {
            let r = review(
                serde_json::json!({"uid": "u", "operation": operation, "name": "capi",
                "resource": resource, "subResource": sub, "userInfo": {"username": "u"},
                "object": object}),
            );
            assert!(PinRequest::from_review(&r).is_none(), "{operation} {sub}");
        }
        // Without its object, a write is refused only while a window is open or could be.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "UPDATE", "name": "capi",
            "namespace": "capi-system", "resource": deployments, "subResource": "scale",
            "userInfo": {"username": "u"}}),
        );
        let pin = PinRequest::from_review(&r).unwrap();
        assert_eq!(pin.parent_to_read(&WindowView::known(&open)), None);
        assert_eq!(
            decide(&pin, &WindowView::known(&[]), &own()),
            PinVerdict::Allow(PinReason::NoOpenWindow)
        );
        assert_eq!(
            decide(&pin, &WindowView::known(&open), &own()),
            PinVerdict::Deny {
                reason: PinReason::NoObject,
                message: "UPDATE of deployments.apps/scale carries no object to pin".into(),
            }
        );
    }

    #[test]
    fn negative_replicas_are_left_for_validation_to_reject() {
        let obj = deployment(Some(-3), None, true);
        let req = PinRequest {
            namespace: "capi-system",
            name: "capi-controller-manager",
            target: PinTarget::Deployment {
                object: &obj,
                old_object: None,
            },
        };
        assert_eq!(
            decide(&req, &WindowView::known(&windows()), &own()),
            PinVerdict::Allow(PinReason::InvalidReplicas)
        );
        let labels = capi_labels();
        let scale = ObjectView {
            spec: Some(SpecView { replicas: Some(-1) }),
            ..ObjectView::default()
        };
        let req = PinRequest {
            target: PinTarget::Scale {
                object: &scale,
                parent: ParentDeployment::Known {
                    labels: Some(&labels),
                    annotations: None,
                    stale: None,
                },
            },
            ..req
        };
        assert_eq!(
            decide(&req, &WindowView::known(&windows()), &own()),
            PinVerdict::Allow(PinReason::InvalidReplicas)
        );
    }

    #[test]
    fn saved_replicas_parse() {
        assert_eq!(SavedReplicas::parse(" 3 "), Some(SavedReplicas(3)));
        assert_eq!(SavedReplicas::parse("-1"), None);
        assert_eq!(SavedReplicas::parse("x"), None);
    }
}
