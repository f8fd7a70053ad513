//! The sync-finalizer guard's rule (docs/ARCHITECTURE.md §1.1): a pure function from a DELETE, the namespace
//! it happens in and the configured identities to a verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::admission::{AdmissionRequest, Operation};
use crate::rules::identity::{
    Identities, KcpNamespace, KcpNamespaceError, Located, NamespaceLocator, Requester, SyncTarget,
};

/// A blocking soft finalizer: `finalizers.workload.<domain>/<key>` with a non-empty value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftFinalizer {
    pub annotation: String,
    pub key: String,
    pub value: String,
}

/// What the guard keeps of a Namespace: its blocking sync finalizers and its locator, nothing
/// else. Cloning it costs two reference counts; a namespace with a locator and no hold costs no
/// allocation of its own (its sync target is shared, see `Identities::locate_shared`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceMeta {
    /// `None` when nothing blocks (most namespaces).
    pub finalizers: Option<Arc<[SoftFinalizer]>>,
    /// The namespace's locator, hashed once per sync target instead of on every request.
    pub located: Option<Arc<Located>>,
    /// The kcp namespace the locator names, or why it names none; kept only when handoff reads
    /// kcp (`Identities::reads_kcp`).
    pub kcp: Option<Arc<Result<KcpNamespace, KcpNamespaceError>>>,
}

/// Blocking soft finalizers among `annotations`, as kcp reads them: any value but `""` blocks.
pub fn blocking_finalizers<'a, I>(annotations: I, ids: &Identities) -> Vec<SoftFinalizer>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    annotations
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .filter_map(|(k, v)| {
            ids.finalizer_key(k).map(|key| SoftFinalizer {
                annotation: k.clone(),
                key: key.to_string(),
                value: v.clone(),
            })
        })
        .collect()
}

impl NamespaceMeta {
    pub fn from_annotations(
        annotations: Option<&BTreeMap<String, String>>,
        ids: &Identities,
    ) -> Self {
        let finalizers = annotations
            .map(|a| blocking_finalizers(a, ids))
            .filter(|f| !f.is_empty())
            .map(Arc::from);
        // The first configured domain whose locator parses wins; an unparsable locator is as
        // good as none, which leaves a syncer unresolved and so held wherever anything blocks.
        let locator = annotations.and_then(|a| {
            ids.locator_keys()
                .iter()
                .filter_map(|k| a.get(k))
                .find_map(|v| serde_json::from_str::<NamespaceLocator>(v).ok())
        });
        NamespaceMeta {
            finalizers,
            kcp: locator
                .as_ref()
                .filter(|_| ids.reads_kcp())
                .map(|l| Arc::new(l.kcp_namespace())),
            located: locator.map(|l| ids.locate_shared(&l)),
        }
    }

    /// The blocking sync finalizers, empty when there are none.
    pub fn holds(&self) -> &[SoftFinalizer] {
        self.finalizers.as_deref().unwrap_or(&[])
    }

    /// Whether anything in this namespace is relevant to the guard at all.
    pub fn is_interesting(&self) -> bool {
        self.finalizers.is_some() || self.located.is_some()
    }
}

/// What the edge found out about the namespace a DELETE happens in.
#[derive(Debug, Clone, Copy)]
pub enum NamespaceState<'a> {
    Known(&'a NamespaceMeta),
    /// Carries nothing the guard reads, does not exist, or was not read (a cluster-scoped
    /// object, or a requester that cannot be a sync target).
    Plain,
    /// The cache misses and the API could not be asked; the string says why.
    Unavailable(&'a str),
}

/// What the edge found out about the kcp namespace the namespace's locator names: one more
/// place a namespace sync finalizer may be set, under the same rule.
#[derive(Debug, Clone, Copy, Default)]
pub enum KcpState<'a> {
    /// handoff does not read kcp, the namespace names no kcp namespace, or the requester
    /// cannot be a sync target (nothing is read for anyone else).
    #[default]
    NotRead,
    /// Read within `--max-staleness`: its blocking sync finalizers (none when it has none or
    /// does not exist). `server` is kcp's base URL, for the message that says how to lift one.
    Known {
        at: &'a KcpNamespace,
        holds: &'a [SoftFinalizer],
        server: &'a str,
    },
    /// Could not be read (kcp unreachable, no fresh view, or the locator names no usable kcp
    /// namespace); the string says why.
    Unavailable {
        at: Option<&'a KcpNamespace>,
        why: &'a str,
    },
}

/// A DELETE as the guard sees it.
#[derive(Debug, Clone)]
pub struct DeleteRequest<'a> {
    pub username: &'a str,
    /// The resource, as `configmaps` or `deployments.apps`, for messages.
    pub resource: String,
    /// The namespace the object lives in; for a Namespace, the namespace itself.
    pub namespace: Option<&'a str>,
    /// The object's name, or `None` for a collection-level delete.
    pub name: Option<&'a str>,
    pub is_namespace: bool,
    /// A per-item call of a delete-collection: no `name` key, the item in `oldObject`.
    pub collection_item: bool,
    pub object_annotations: Option<&'a BTreeMap<String, String>>,
    pub dry_run: bool,
}

impl<'a> DeleteRequest<'a> {
    /// `None` when the request is not a DELETE.
    pub fn from_review(req: &'a AdmissionRequest) -> Option<Self> {
        if req.operation != Operation::Delete {
            return None;
        }
        let is_namespace = req.resource.group.is_empty()
            && req.resource.resource == "namespaces"
            && req.sub_resource.as_deref().unwrap_or("").is_empty();
        let name = req.object_name();
        let namespace = if is_namespace {
            name.or(req.namespace.as_deref())
        } else {
            // The API server always sets `namespace` for namespaced objects; the object's own
            // metadata is the fallback, so a missing field cannot skip rule 1.
            req.namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .or_else(|| {
                    req.old_object
                        .as_ref()
                        .and_then(|o| o.metadata.namespace.as_deref())
                        .filter(|n| !n.is_empty())
                })
        };
        Some(DeleteRequest {
            username: &req.user_info.username,
            resource: req.resource_path(),
            namespace,
            name,
            is_namespace,
            collection_item: req.name.is_none() && name.is_some(),
            object_annotations: req
                .old_object
                .as_ref()
                .and_then(|o| o.metadata.annotations.as_ref()),
            dry_run: req.is_dry_run(),
        })
    }

    /// The namespace to read state for, if the requester might be held at all.
    pub fn namespace_to_read(&self, ids: &Identities) -> Option<&'a str> {
        if ids.is_candidate(self.username) {
            self.namespace
        } else {
            None
        }
    }

    fn what(&self) -> String {
        match (self.name, self.collection_item) {
            (Some(n), false) => format!("{} \"{n}\"", self.resource),
            (Some(n), true) => format!("{} \"{n}\" (delete-collection item)", self.resource),
            (None, _) => format!("the {} collection", self.resource),
        }
    }
}

/// Which part of the rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Rule 1: the namespace carries the sync target's finalizer.
    NamespaceHold,
    /// Rule 2: the object itself carries the sync target's soft finalizer.
    ObjectHold,
    /// Rule 3: the object is a Namespace that carries it.
    NamespaceItself,
    /// Rule 4: a collection-level delete in a namespace that carries it.
    CollectionHold,
    /// A syncer we cannot tie to a sync target, where something blocks.
    UnresolvedSyncer,
    /// The namespace could not be read: fail closed.
    StateUnavailable,
    /// The kcp namespace the locator names could not be read: fail closed.
    KcpUnavailable,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NamespaceHold => "namespace-sync-finalizer",
            Rule::ObjectHold => "object-soft-finalizer",
            Rule::NamespaceItself => "namespace-itself",
            Rule::CollectionHold => "delete-collection",
            Rule::UnresolvedSyncer => "unresolved-syncer",
            Rule::StateUnavailable => "state-unavailable",
            Rule::KcpUnavailable => "kcp-unavailable",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllowReason {
    NotDelete,
    NotSyncTarget,
    NoHold,
}

impl AllowReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AllowReason::NotDelete => "not-a-delete",
            AllowReason::NotSyncTarget => "not-a-sync-target",
            AllowReason::NoHold => "no-hold",
        }
    }
}

/// Whether the namespace view can be shown to be current (docs/ARCHITECTURE.md §1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Read just now, proven by the watch within `--max-staleness`, or state from files.
    Proven,
    /// Nothing has proven the cached view for longer than `--max-staleness`: a quiet cluster,
    /// or a watch connection that died without a word.
    Unproven,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardVerdict {
    Allow(AllowReason),
    Deny {
        rule: Rule,
        message: String,
    },
    /// It would allow a sync target's delete on an unproven view: read the namespace now and
    /// decide on that. Never the verdict on a proven view, nor for anyone else.
    ReadAgain,
}

impl GuardVerdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, GuardVerdict::Allow(_))
    }
}

/// Decide a DELETE on the physical namespace alone (no kcp), on a proven view.
pub fn decide(req: &DeleteRequest<'_>, ns: NamespaceState<'_>, ids: &Identities) -> GuardVerdict {
    decide_with_kcp(req, ns, KcpState::NotRead, Freshness::Proven, ids)
}

/// Decide a DELETE: the namespace's holds are those on the physical namespace and those on the
/// kcp namespace its locator names, under one rule.
pub fn decide_with_kcp(
    req: &DeleteRequest<'_>,
    ns: NamespaceState<'_>,
    kcp: KcpState<'_>,
    fresh: Freshness,
    ids: &Identities,
) -> GuardVerdict {
    match decide_inner(req, ns, kcp, ids) {
        GuardVerdict::Deny { rule, message } => GuardVerdict::Deny {
            rule,
            message: super::one_line(message),
        },
        GuardVerdict::Allow(_)
            if fresh == Freshness::Unproven && req.namespace_to_read(ids).is_some() =>
        {
            GuardVerdict::ReadAgain
        }
        verdict => verdict,
    }
}

/// Where a namespace sync finalizer was found.
#[derive(Debug, Clone, Copy)]
enum Place<'a> {
    /// On the physical namespace the object lives in.
    Physical,
    /// On the kcp namespace the locator names.
    Kcp {
        at: &'a KcpNamespace,
        server: &'a str,
    },
}

/// A namespace sync finalizer and where it was found.
#[derive(Debug, Clone, Copy)]
struct Hold<'a> {
    f: &'a SoftFinalizer,
    place: Place<'a>,
}

fn decide_inner(
    req: &DeleteRequest<'_>,
    ns: NamespaceState<'_>,
    kcp: KcpState<'_>,
    ids: &Identities,
) -> GuardVerdict {
    if !ids.is_candidate(req.username) {
        return GuardVerdict::Allow(AllowReason::NotSyncTarget);
    }
    let meta = match ns {
        NamespaceState::Known(m) => Some(m),
        NamespaceState::Plain => None,
        NamespaceState::Unavailable(why) => {
            return GuardVerdict::Deny {
                rule: Rule::StateUnavailable,
                message: format!(
                    "handoff cannot read namespace \"{}\" to check its sync finalizers ({why}); \
                     the delete of {} is refused until it can (fail closed: the syncer retries, \
                     a deleted object does not come back)",
                    req.namespace.unwrap_or(""),
                    req.what()
                ),
            };
        }
    };
    let object_holds = req
        .object_annotations
        .map(|a| blocking_finalizers(a, ids))
        .unwrap_or_default();
    // kcp first: a hold set there is usually mirrored here too, and kcp is where it is lifted.
    let ns_holds: Vec<Hold<'_>> = match kcp {
        KcpState::Known { at, holds, server } => holds
            .iter()
            .map(|f| Hold {
                f,
                place: Place::Kcp { at, server },
            })
            .collect(),
        _ => Vec::new(),
    }
    .into_iter()
    .chain(
        meta.map(NamespaceMeta::holds)
            .unwrap_or(&[])
            .iter()
            .map(|f| Hold {
                f,
                place: Place::Physical,
            }),
    )
    .collect();
    let kcp_unavailable = match kcp {
        KcpState::Unavailable { at, why } => Some(GuardVerdict::Deny {
            rule: Rule::KcpUnavailable,
            message: format!(
                "handoff cannot read {} to check its sync finalizers ({why}); the delete of {} \
                 in namespace \"{}\" is refused until it can (fail closed: the syncer retries, a \
                 deleted object does not come back)",
                at.map_or_else(
                    || "the kcp namespace this namespace's locator names".to_string(),
                    KcpNamespace::describe
                ),
                req.what(),
                req.namespace.unwrap_or("")
            ),
        }),
        _ => None,
    };

    let target = match ids.resolve_located(req.username, meta.and_then(|m| m.located.as_deref())) {
        Requester::NotSyncTarget => return GuardVerdict::Allow(AllowReason::NotSyncTarget),
        Requester::SyncTarget(t) => t,
        Requester::UnresolvedSyncer { reason } => {
            let any = ns_holds
                .first()
                .map(|h| (h.f, holder(req, Some(h))))
                .or(object_holds.first().map(|f| (f, holder(req, None))));
            return match any {
                None => kcp_unavailable.unwrap_or(GuardVerdict::Allow(AllowReason::NoHold)),
                Some((f, holder)) => GuardVerdict::Deny {
                    rule: Rule::UnresolvedSyncer,
                    message: format!(
                        "{} looks like a kcp syncer but handoff cannot tell which sync target it \
                         serves: {reason}. Because {} carries the sync finalizer {}=\"{}\", the \
                         delete of {} is refused: it could be the sync target being held. Fix the \
                         namespace locator, or name this user in handoff's config file",
                        req.username,
                        holder,
                        f.annotation,
                        f.value,
                        req.what()
                    ),
                },
            };
        }
    };

    let ns_hold = ns_holds.iter().find(|h| target.has_key(&h.f.key));
    // For a Namespace the object's own annotations are its sync finalizers; they may be
    // fresher than the cache.
    let obj_hold = object_holds.iter().find(|f| target.has_key(&f.key));
    let ns_name = req.namespace.unwrap_or("");
    if req.is_namespace {
        // A hold set in kcp is named as such (that is where it is lifted); otherwise the
        // namespace's own annotations first: they may be fresher than the cache.
        let hold = match (ns_hold, obj_hold) {
            (Some(h), _) if matches!(h.place, Place::Kcp { .. }) => Some(*h),
            (_, Some(f)) => Some(Hold {
                f,
                place: Place::Physical,
            }),
            (h, None) => h.copied(),
        };
        if let Some(h) = hold {
            return GuardVerdict::Deny {
                rule: Rule::NamespaceItself,
                message: namespace_message(
                    req,
                    &target,
                    ns_name,
                    h,
                    "deleting the namespace would delete everything in it",
                ),
            };
        }
        return kcp_unavailable.unwrap_or(GuardVerdict::Allow(AllowReason::NoHold));
    }
    if let Some(&h) = ns_hold {
        let rule = if req.name.is_none() {
            Rule::CollectionHold
        } else {
            Rule::NamespaceHold
        };
        return GuardVerdict::Deny {
            rule,
            message: namespace_message(
                req,
                &target,
                ns_name,
                h,
                "its objects stay until the hold is lifted",
            ),
        };
    }
    if let Some(f) = obj_hold {
        return GuardVerdict::Deny {
            rule: Rule::ObjectHold,
            message: format!(
                "{} carries the soft finalizer {}=\"{}\" for {}, so that sync target may not delete \
                 it yet. The hold lifts when the finalizer's owner removes the annotation or sets \
                 it to \"\"",
                req.what(),
                f.annotation,
                f.value,
                target
            ),
        };
    }
    kcp_unavailable.unwrap_or(GuardVerdict::Allow(AllowReason::NoHold))
}

/// What carries the hold `h` (a namespace's), or the object itself when `None`.
fn holder(req: &DeleteRequest<'_>, h: Option<&Hold<'_>>) -> String {
    match h.map(|h| h.place) {
        Some(Place::Kcp { at, .. }) => at.describe(),
        Some(Place::Physical) => format!("namespace \"{}\"", req.namespace.unwrap_or("")),
        None if req.is_namespace => format!("namespace \"{}\"", req.namespace.unwrap_or("")),
        None => req.what(),
    }
}

fn namespace_message(
    req: &DeleteRequest<'_>,
    target: &SyncTarget,
    ns: &str,
    h: Hold<'_>,
    consequence: &str,
) -> String {
    let f = h.f;
    let mut m = String::with_capacity(400);
    if let Place::Kcp { at, server } = h.place {
        let _ = write!(
            m,
            "{} carries the sync finalizer {}=\"{}\" for {}, so that sync target may not delete \
             {} in namespace \"{ns}\" ({consequence}). The hold is set in kcp (workspace {}, \
             namespace {}) and is lifted there, by removing the annotation or setting it to \"\": \
             kubectl --server {}/clusters/{} annotate namespace {} {}-",
            at.describe(),
            f.annotation,
            f.value,
            target,
            req.what(),
            at.cluster,
            at.namespace,
            server.trim_end_matches('/'),
            at.cluster,
            at.namespace,
            f.annotation
        );
        return m;
    }
    let _ = write!(
        m,
        "namespace \"{ns}\" carries the sync finalizer {}=\"{}\" for {}, so that sync target may \
         not delete {} ({consequence}). The hold lifts when the annotation is removed or set to \
         \"\": kubectl annotate namespace {ns} {}-",
        f.annotation,
        f.value,
        target,
        req.what(),
        f.annotation
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";
    const SYNCER: &str =
        "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw";
    const OTHER_SYNCER: &str =
        "system:serviceaccount:kcp-syncer-eu-abcdefgh:kcp-syncer-eu-abcdefgh";
    const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ids() -> Identities {
        let mut ids = Identities::default();
        ids.add_cluster_name("explicit-user", "root:org:ws", "us-west1");
        ids.add_key("explicit-key-user", KEY);
        ids.add_key("explicit-other", "someOtherKey");
        ids
    }

    struct Row {
        name: &'static str,
        user: &'static str,
        ns_annotations: Option<Vec<(&'static str, &'static str)>>,
        object_annotations: Vec<(&'static str, &'static str)>,
        is_namespace: bool,
        object_name: Option<&'static str>,
        collection_item: bool,
        state: &'static str, // "known", "plain", "unavailable"
        want: Result<AllowReason, Rule>,
    }

    fn row(name: &'static str, user: &'static str) -> Row {
        Row {
            name,
            user,
            ns_annotations: Some(vec![
                ("kcp.io/namespace-locator", LOCATOR),
                (
                    "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
                    "glbc-migration",
                ),
            ]),
            object_annotations: vec![],
            is_namespace: false,
            object_name: Some("cm"),
            collection_item: false,
            state: "known",
            want: Ok(AllowReason::NoHold),
        }
    }

    #[test]
    fn table() {
        let hold = (
            "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
            "glbc-migration",
        );
        let legacy_hold = (
            "finalizers.workload.kcp.dev/2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5",
            "x",
        );
        let locator = ("kcp.io/namespace-locator", LOCATOR);
        let legacy_locator = (
            "kcp.dev/namespace-locator",
            r#"{"syncTarget":{"workspace":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"workspace":"root:org:ws","namespace":"test"}"#,
        );
        let rows = vec![
            Row {
                want: Err(Rule::NamespaceHold),
                ..row("namespace finalizer holds the syncer's delete", SYNCER)
            },
            Row {
                want: Ok(AllowReason::NotSyncTarget),
                ..row("other users are never held", "admin")
            },
            Row {
                want: Ok(AllowReason::NotSyncTarget),
                ..row(
                    "controllers are never held",
                    "system:serviceaccount:kube-system:namespace-controller",
                )
            },
            Row {
                ns_annotations: Some(vec![locator, (hold.0, "")]),
                ..row("empty finalizer value does not block", SYNCER)
            },
            Row {
                ns_annotations: Some(vec![locator]),
                ..row("no finalizer, no hold", SYNCER)
            },
            Row {
                ns_annotations: Some(vec![
                    locator,
                    ("finalizers.workload.kcp.io/someOtherKey", "x"),
                ]),
                ..row(
                    "another sync target's finalizer does not hold this one",
                    SYNCER,
                )
            },
            Row {
                ns_annotations: Some(vec![locator]),
                object_annotations: vec![hold],
                want: Err(Rule::ObjectHold),
                ..row("object soft finalizer holds", SYNCER)
            },
            Row {
                ns_annotations: Some(vec![locator]),
                object_annotations: vec![(hold.0, "")],
                ..row(
                    "object soft finalizer with empty value does not hold",
                    SYNCER,
                )
            },
            Row {
                is_namespace: true,
                object_name: Some("kcp-ns"),
                object_annotations: vec![locator, hold],
                want: Err(Rule::NamespaceItself),
                ..row("deleting the held namespace itself", SYNCER)
            },
            Row {
                is_namespace: true,
                object_name: Some("kcp-ns"),
                object_annotations: vec![locator],
                want: Err(Rule::NamespaceItself),
                ..row("namespace held in cache though oldObject lacks it", SYNCER)
            },
            Row {
                is_namespace: true,
                object_name: Some("kcp-ns"),
                ns_annotations: Some(vec![locator]),
                object_annotations: vec![locator],
                ..row("deleting an unheld namespace", SYNCER)
            },
            Row {
                object_name: None,
                want: Err(Rule::CollectionHold),
                ..row("collection-level delete in a held namespace", SYNCER)
            },
            Row {
                collection_item: true,
                want: Err(Rule::NamespaceHold),
                ..row("delete-collection item in a held namespace", SYNCER)
            },
            Row {
                ns_annotations: Some(vec![legacy_locator, legacy_hold]),
                want: Err(Rule::NamespaceHold),
                ..row("kcp.dev domain and legacy key scheme", SYNCER)
            },
            Row {
                ns_annotations: Some(vec![legacy_locator, hold]),
                want: Err(Rule::NamespaceHold),
                ..row("kcp.dev locator with kcp.io finalizer", SYNCER)
            },
            Row {
                user: "explicit-user",
                ns_annotations: Some(vec![hold]),
                want: Err(Rule::NamespaceHold),
                ..row(
                    "explicit identity by cluster and name, no locator needed",
                    "",
                )
            },
            Row {
                user: "explicit-key-user",
                ns_annotations: Some(vec![hold]),
                want: Err(Rule::NamespaceHold),
                ..row("explicit identity by key", "")
            },
            Row {
                user: "explicit-other",
                ns_annotations: Some(vec![hold]),
                ..row("explicit identity of another sync target passes", "")
            },
            Row {
                ns_annotations: Some(vec![hold]),
                want: Err(Rule::UnresolvedSyncer),
                ..row(
                    "syncer without locator in a held namespace is denied",
                    SYNCER,
                )
            },
            Row {
                ns_annotations: Some(vec![]),
                ..row(
                    "syncer without locator in an unheld namespace passes",
                    SYNCER,
                )
            },
            Row {
                user: OTHER_SYNCER,
                want: Err(Rule::UnresolvedSyncer),
                ..row(
                    "syncer whose name does not match the locator is denied where held",
                    "",
                )
            },
            Row {
                user: OTHER_SYNCER,
                ns_annotations: Some(vec![locator]),
                ..row("mismatched syncer where nothing blocks passes", "")
            },
            Row {
                ns_annotations: Some(vec![]),
                object_annotations: vec![hold],
                want: Err(Rule::UnresolvedSyncer),
                ..row("unresolved syncer and a held object", SYNCER)
            },
            Row {
                state: "plain",
                ns_annotations: None,
                ..row("namespace gone: nothing holds", SYNCER)
            },
            Row {
                state: "unavailable",
                ns_annotations: None,
                want: Err(Rule::StateUnavailable),
                ..row("namespace unreadable: fail closed for syncers", SYNCER)
            },
            Row {
                state: "unavailable",
                ns_annotations: None,
                want: Ok(AllowReason::NotSyncTarget),
                ..row("namespace unreadable: others pass", "admin")
            },
        ];
        let ids = ids();
        for r in rows {
            let ns_ann = r.ns_annotations.as_ref().map(|p| annotations(p));
            let meta = NamespaceMeta::from_annotations(ns_ann.as_ref(), &ids);
            let obj = annotations(&r.object_annotations);
            let req = DeleteRequest {
                username: r.user,
                resource: if r.is_namespace {
                    "namespaces".into()
                } else {
                    "configmaps".into()
                },
                namespace: Some("kcp-ns"),
                name: r.object_name,
                is_namespace: r.is_namespace,
                collection_item: r.collection_item,
                object_annotations: Some(&obj),
                dry_run: false,
            };
            let state = match r.state {
                "known" => NamespaceState::Known(&meta),
                "plain" => NamespaceState::Plain,
                _ => NamespaceState::Unavailable("connection refused"),
            };
            let got = decide(&req, state, &ids);
            match (&got, &r.want) {
                (GuardVerdict::Allow(a), Ok(w)) => assert_eq!(a, w, "{}", r.name),
                (GuardVerdict::Deny { rule, .. }, Err(w)) => assert_eq!(rule, w, "{}", r.name),
                _ => panic!("{}: got {got:?}, want {:?}", r.name, r.want),
            }
            // On a view nothing has proven lately (docs/ARCHITECTURE.md §1.3), a sync target's delete is
            // never allowed, only read again; denials stand, and everyone else passes as before.
            let unproven =
                decide_with_kcp(&req, state, KcpState::NotRead, Freshness::Unproven, &ids);
            match (&unproven, ids.is_candidate(r.user)) {
                (GuardVerdict::ReadAgain, true) => assert!(got.is_allowed(), "{}", r.name),
                (GuardVerdict::ReadAgain, false) => panic!("{}: {} read again", r.name, r.user),
                (v, true) => assert!(!v.is_allowed() && *v == got, "{}: {v:?}", r.name),
                (v, false) => assert_eq!(*v, got, "{}", r.name),
            }
        }
    }

    /// The denial of the syncer's delete of Secret `name` in namespace `ns`, which carries the
    /// us-west1 sync finalizer with `value`.
    fn held_secret_delete(ns: &str, value: &str, name: &str) -> String {
        let ids = ids();
        let ann = annotations(&[
            ("kcp.io/namespace-locator", LOCATOR),
            (
                "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
                value,
            ),
        ]);
        let meta = NamespaceMeta::from_annotations(Some(&ann), &ids);
        let req = DeleteRequest {
            username: SYNCER,
            resource: "secrets".into(),
            namespace: Some(ns),
            name: Some(name),
            is_namespace: false,
            collection_item: false,
            object_annotations: None,
            dry_run: false,
        };
        match decide(&req, NamespaceState::Known(&meta), &ids) {
            GuardVerdict::Deny { message, .. } => message,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn denial_message_says_what_where_who_and_how_to_lift() {
        let message = held_secret_delete("kcp-33jbiactwhg0", "glbc-migration", "db-password");
        for part in [
            "namespace \"kcp-33jbiactwhg0\"",
            "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g=\"glbc-migration\"",
            "sync target \"us-west1\" (cluster root:org:ws)",
            "secrets \"db-password\"",
            "kubectl annotate namespace kcp-33jbiactwhg0 finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g-",
        ] {
            assert!(message.contains(part), "missing {part:?} in {message}");
        }
        assert!(
            !message.contains('\n'),
            "kubectl prints one line: {message}"
        );
    }

    fn review(json: serde_json::Value) -> crate::admission::AdmissionRequest {
        let mut body =
            serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        body["request"] = json;
        crate::admission::decode_review(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    #[test]
    fn delete_requests_from_reviews() {
        let ids = ids();
        // A namespaced delete without `namespace` falls back to the object's metadata.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "DELETE", "name": "cm",
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "userInfo": {"username": SYNCER},
            "oldObject": {"metadata": {"name": "cm", "namespace": "kcp-ns"}}}),
        );
        let d = DeleteRequest::from_review(&r).unwrap();
        assert_eq!(d.namespace, Some("kcp-ns"));
        assert_eq!(d.namespace_to_read(&ids), Some("kcp-ns"));
        assert!(!d.collection_item);
        // A Namespace delete: the namespace is the object, whatever `namespace` says.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "DELETE", "name": "kcp-ns", "namespace": "kcp-ns",
            "resource": {"group": "", "version": "v1", "resource": "namespaces"},
            "userInfo": {"username": "admin"}, "oldObject": null}),
        );
        let d = DeleteRequest::from_review(&r).unwrap();
        assert!(d.is_namespace);
        assert_eq!(d.namespace, Some("kcp-ns"));
        assert_eq!(d.namespace_to_read(&ids), None, "admin is never looked up");
        // A delete-collection item: no `name` key, the item in oldObject.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "DELETE", "namespace": "kcp-ns",
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "userInfo": {"username": SYNCER}, "oldObject": {"metadata": {"name": "a"}}}),
        );
        let d = DeleteRequest::from_review(&r).unwrap();
        assert!(d.collection_item);
        assert_eq!(d.name, Some("a"));
        // A collection-level call: empty name, no object.
        let r = review(
            serde_json::json!({"uid": "u", "operation": "DELETE", "namespace": "kcp-ns", "name": "",
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "userInfo": {"username": SYNCER}}),
        );
        let d = DeleteRequest::from_review(&r).unwrap();
        assert_eq!(d.name, None);
        assert!(!d.collection_item);
        // Not a delete.
        let r = review(serde_json::json!({"uid": "u", "operation": "CREATE"}));
        assert!(DeleteRequest::from_review(&r).is_none());
    }

    #[test]
    fn a_multi_line_finalizer_value_still_denies_on_one_line() {
        let message = held_secret_delete("kcp-ns", "glbc-migration\nstep 2", "s");
        assert!(
            !message.contains('\n') && message.contains("glbc-migration\\nstep 2"),
            "{message}"
        );
    }

    #[test]
    fn namespace_meta_keeps_only_what_matters() {
        let ids = ids();
        let ann = annotations(&[
            ("kcp.io/namespace-locator", "not json"),
            ("finalizers.workload.kcp.io/A", "x"),
            ("finalizers.workload.kcp.io/B", ""),
            ("finalizers.workload.example.com/C", "x"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ]);
        let m = NamespaceMeta::from_annotations(Some(&ann), &ids);
        assert_eq!(m.holds().len(), 1);
        assert_eq!(m.holds()[0].key, "A");
        assert!(m.located.is_none());
        assert!(!NamespaceMeta::from_annotations(None, &ids).is_interesting());
    }

    /// The kcp namespace is one more place a namespace sync finalizer may be set: rows for a
    /// hold in kcp only, on the physical namespace only, both, neither, and kcp unreadable;
    /// everyone who is not a sync target passes whatever kcp says.
    #[test]
    fn kcp_table() {
        let hold = (
            "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
            "glbc-migration",
        );
        let legacy_hold = (
            "finalizers.workload.kcp.dev/2gzO8uuQmIoZ2FE95zoOPKtrtGGXzzjAvtl6q5",
            "x",
        );
        let other = ("finalizers.workload.kcp.io/someOtherKey", "x");
        let locator = ("kcp.io/namespace-locator", LOCATOR);
        let at = KcpNamespace {
            cluster: "root:org:ws".into(),
            namespace: "test".into(),
        };
        // (name, user, physical annotations, kcp: Some(annotations) read / None unavailable,
        //  is_namespace, want, where the message must say the hold is)
        type KcpRow = (
            &'static str,
            &'static str,
            Vec<(&'static str, &'static str)>,
            Option<Vec<(&'static str, &'static str)>>,
            bool,
            Result<AllowReason, Rule>,
            &'static str,
        );
        let rows: Vec<KcpRow> = vec![
            (
                "hold in kcp only",
                SYNCER,
                vec![locator],
                Some(vec![hold]),
                false,
                Err(Rule::NamespaceHold),
                "in kcp",
            ),
            (
                "hold in kcp only, kcp.dev domain and legacy key",
                SYNCER,
                vec![locator],
                Some(vec![legacy_hold]),
                false,
                Err(Rule::NamespaceHold),
                "in kcp",
            ),
            (
                "hold on the physical namespace only",
                SYNCER,
                vec![locator, hold],
                Some(vec![]),
                false,
                Err(Rule::NamespaceHold),
                "kubectl annotate namespace kcp-ns",
            ),
            (
                "hold in both: named where it is lifted, kcp",
                SYNCER,
                vec![locator, hold],
                Some(vec![hold]),
                false,
                Err(Rule::NamespaceHold),
                "in kcp",
            ),
            (
                "hold in neither",
                SYNCER,
                vec![locator],
                Some(vec![]),
                false,
                Ok(AllowReason::NoHold),
                "",
            ),
            (
                "empty value in kcp does not block",
                SYNCER,
                vec![locator],
                Some(vec![(hold.0, "")]),
                false,
                Ok(AllowReason::NoHold),
                "",
            ),
            (
                "another sync target's hold in kcp",
                SYNCER,
                vec![locator],
                Some(vec![other]),
                false,
                Ok(AllowReason::NoHold),
                "",
            ),
            (
                "kcp unreadable: fail closed for the sync target",
                SYNCER,
                vec![locator],
                None,
                false,
                Err(Rule::KcpUnavailable),
                "cannot read kcp namespace \"test\" (workspace root:org:ws)",
            ),
            (
                "kcp unreadable, physical hold: the physical hold is named",
                SYNCER,
                vec![locator, hold],
                None,
                false,
                Err(Rule::NamespaceHold),
                "kubectl annotate namespace kcp-ns",
            ),
            (
                "kcp unreadable: others pass",
                "admin",
                vec![locator],
                None,
                false,
                Ok(AllowReason::NotSyncTarget),
                "",
            ),
            (
                "kcp hold: others pass",
                "admin",
                vec![locator],
                Some(vec![hold]),
                false,
                Ok(AllowReason::NotSyncTarget),
                "",
            ),
            (
                "kcp hold holds the namespace itself",
                SYNCER,
                vec![locator],
                Some(vec![hold]),
                true,
                Err(Rule::NamespaceItself),
                "in kcp",
            ),
            (
                "kcp unreadable holds the namespace's deletion",
                SYNCER,
                vec![locator],
                None,
                true,
                Err(Rule::KcpUnavailable),
                "cannot read",
            ),
            (
                "unresolved syncer where kcp holds",
                OTHER_SYNCER,
                vec![locator],
                Some(vec![other]),
                false,
                Err(Rule::UnresolvedSyncer),
                "kcp namespace \"test\" (workspace root:org:ws)",
            ),
            (
                "unresolved syncer, kcp unreadable",
                OTHER_SYNCER,
                vec![locator],
                None,
                false,
                Err(Rule::KcpUnavailable),
                "cannot read",
            ),
            (
                "explicit identity held in kcp",
                "explicit-user",
                vec![locator],
                Some(vec![hold]),
                false,
                Err(Rule::NamespaceHold),
                "in kcp",
            ),
        ];
        let mut ids = ids();
        ids.set_reads_kcp(true);
        for (name, user, physical, upstream, is_namespace, want, says) in rows {
            let ann = annotations(&physical);
            let meta = NamespaceMeta::from_annotations(Some(&ann), &ids);
            assert_eq!(
                meta.kcp.as_deref(),
                Some(&Ok(at.clone())),
                "{name}: the locator's kcp namespace is kept"
            );
            let up = upstream.map(|a| blocking_finalizers(&annotations(&a), &ids));
            let kcp = match &up {
                Some(holds) => KcpState::Known {
                    at: &at,
                    holds,
                    server: "https://kcp.example:6443",
                },
                None => KcpState::Unavailable {
                    at: Some(&at),
                    why: "connection refused",
                },
            };
            let req = DeleteRequest {
                username: user,
                resource: if is_namespace {
                    "namespaces"
                } else {
                    "configmaps"
                }
                .into(),
                namespace: Some("kcp-ns"),
                name: Some(if is_namespace { "kcp-ns" } else { "cm" }),
                is_namespace,
                collection_item: false,
                object_annotations: Some(&ann),
                dry_run: false,
            };
            let got = decide_with_kcp(
                &req,
                NamespaceState::Known(&meta),
                kcp,
                Freshness::Proven,
                &ids,
            );
            match (&got, &want) {
                (GuardVerdict::Allow(a), Ok(w)) => assert_eq!(a, w, "{name}"),
                (GuardVerdict::Deny { rule, message }, Err(w)) => {
                    assert_eq!(rule, w, "{name}");
                    assert!(message.contains(says), "{name}: {message}");
                }
                _ => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_kcp_denial_says_where_the_hold_is_set_and_how_to_lift_it_there() {
        let mut ids = ids();
        ids.set_reads_kcp(true);
        let ann = annotations(&[("kcp.io/namespace-locator", LOCATOR)]);
        let meta = NamespaceMeta::from_annotations(Some(&ann), &ids);
        let Some(Ok(at)) = meta.kcp.as_deref() else {
            panic!("{meta:?}")
        };
        let holds = blocking_finalizers(
            &annotations(&[(
                "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g",
                "glbc-migration",
            )]),
            &ids,
        );
        let req = DeleteRequest {
            username: SYNCER,
            resource: "secrets".into(),
            namespace: Some("kcp-33jbiactwhg0"),
            name: Some("db-password"),
            is_namespace: false,
            collection_item: false,
            object_annotations: None,
            dry_run: false,
        };
        let kcp = KcpState::Known {
            at,
            holds: &holds,
            server: "https://kcp.example:6443/",
        };
        let GuardVerdict::Deny { message, .. } = decide_with_kcp(
            &req,
            NamespaceState::Known(&meta),
            kcp,
            Freshness::Proven,
            &ids,
        ) else {
            panic!("not denied")
        };
        for part in [
            "kcp namespace \"test\" (workspace root:org:ws)",
            "finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g=\"glbc-migration\"",
            "sync target \"us-west1\" (cluster root:org:ws)",
            "secrets \"db-password\" in namespace \"kcp-33jbiactwhg0\"",
            "The hold is set in kcp",
            "kubectl --server https://kcp.example:6443/clusters/root:org:ws annotate namespace test finalizers.workload.kcp.io/6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g-",
        ] {
            assert!(message.contains(part), "missing {part:?} in {message}");
        }
        // Without kcp nothing about kcp is kept, and the rule is the physical one alone.
        let plain = NamespaceMeta::from_annotations(Some(&ann), &super::tests::ids());
        assert!(plain.kcp.is_none());
        assert!(decide(&req, NamespaceState::Known(&plain), &super::tests::ids()).is_allowed());
    }

    #[test]
    fn a_locator_that_names_no_usable_kcp_namespace_denies_only_a_sync_target() {
        let mut ids = ids();
        ids.set_reads_kcp(true);
        let ann = annotations(&[(
            "kcp.io/namespace-locator",
            r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root/../x","namespace":"test"}"#,
        )]);
        let meta = NamespaceMeta::from_annotations(Some(&ann), &ids);
        let Some(Err(why)) = meta.kcp.as_deref() else {
            panic!("{meta:?}")
        };
        let why = why.to_string();
        let kcp = KcpState::Unavailable {
            at: None,
            why: &why,
        };
        let mut req = DeleteRequest {
            username: SYNCER,
            resource: "configmaps".into(),
            namespace: Some("kcp-ns"),
            name: Some("cm"),
            is_namespace: false,
            collection_item: false,
            object_annotations: None,
            dry_run: false,
        };
        match decide_with_kcp(
            &req,
            NamespaceState::Known(&meta),
            kcp,
            Freshness::Proven,
            &ids,
        ) {
            GuardVerdict::Deny { rule, message } => {
                assert_eq!(rule, Rule::KcpUnavailable);
                assert!(
                    message.contains("the kcp namespace this namespace's locator names")
                        && message.contains("not a kcp logical cluster name"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        req.username = "admin";
        assert_eq!(
            decide_with_kcp(
                &req,
                NamespaceState::Known(&meta),
                kcp,
                Freshness::Proven,
                &ids
            ),
            GuardVerdict::Allow(AllowReason::NotSyncTarget)
        );
    }
}
