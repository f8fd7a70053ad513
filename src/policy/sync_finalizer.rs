//! The sync-finalizer guard's rule (DESIGN §1.1): a pure function from a DELETE, the namespace
//! it happens in and the configured identities to a verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::admission::{AdmissionRequest, Operation};
use crate::policy::identity::{Identities, Located, NamespaceLocator, Requester, SyncTarget};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow(AllowReason),
    Deny { rule: Rule, message: String },
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allow(_))
    }
    pub fn reason(&self) -> &'static str {
        match self {
            Verdict::Allow(r) => r.as_str(),
            Verdict::Deny { rule, .. } => rule.as_str(),
        }
    }
}

/// Decide a DELETE.
pub fn decide(req: &DeleteRequest<'_>, ns: NamespaceState<'_>, ids: &Identities) -> Verdict {
    match decide_inner(req, ns, ids) {
        Verdict::Deny { rule, message } => Verdict::Deny {
            rule,
            message: super::one_line(message),
        },
        allow => allow,
    }
}

fn decide_inner(req: &DeleteRequest<'_>, ns: NamespaceState<'_>, ids: &Identities) -> Verdict {
    if !ids.is_candidate(req.username) {
        return Verdict::Allow(AllowReason::NotSyncTarget);
    }
    let meta = match ns {
        NamespaceState::Known(m) => Some(m),
        NamespaceState::Plain => None,
        NamespaceState::Unavailable(why) => {
            return Verdict::Deny {
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
    let ns_holds: &[SoftFinalizer] = meta.map(NamespaceMeta::holds).unwrap_or(&[]);

    let target = match ids.resolve_located(req.username, meta.and_then(|m| m.located.as_deref())) {
        Requester::NotSyncTarget => return Verdict::Allow(AllowReason::NotSyncTarget),
        Requester::SyncTarget(t) => t,
        Requester::UnresolvedSyncer { reason } => {
            let any = ns_holds.first().or(object_holds.first());
            return match any {
                None => Verdict::Allow(AllowReason::NoHold),
                Some(f) => Verdict::Deny {
                    rule: Rule::UnresolvedSyncer,
                    message: format!(
                        "{} looks like a kcp syncer but handoff cannot tell which sync target it \
                         serves: {reason}. Because {} carries the sync finalizer {}=\"{}\", the \
                         delete of {} is refused: it could be the sync target being held. Fix the \
                         namespace locator, or name this user in handoff's config file",
                        req.username,
                        holder(req, ns_holds, f),
                        f.annotation,
                        f.value,
                        req.what()
                    ),
                },
            };
        }
    };

    let ns_hold = ns_holds.iter().find(|f| target.has_key(&f.key));
    // For a Namespace the object's own annotations are its sync finalizers; they may be
    // fresher than the cache.
    let obj_hold = object_holds.iter().find(|f| target.has_key(&f.key));
    let ns_name = req.namespace.unwrap_or("");
    if req.is_namespace {
        if let Some(f) = obj_hold.or(ns_hold) {
            return Verdict::Deny {
                rule: Rule::NamespaceItself,
                message: namespace_message(
                    req,
                    &target,
                    ns_name,
                    f,
                    "deleting the namespace would delete everything in it",
                ),
            };
        }
        return Verdict::Allow(AllowReason::NoHold);
    }
    if let Some(f) = ns_hold {
        let rule = if req.name.is_none() {
            Rule::CollectionHold
        } else {
            Rule::NamespaceHold
        };
        return Verdict::Deny {
            rule,
            message: namespace_message(
                req,
                &target,
                ns_name,
                f,
                "its objects stay until the hold is lifted",
            ),
        };
    }
    if let Some(f) = obj_hold {
        return Verdict::Deny {
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
    Verdict::Allow(AllowReason::NoHold)
}

fn holder(req: &DeleteRequest<'_>, ns_holds: &[SoftFinalizer], f: &SoftFinalizer) -> String {
    if ns_holds.iter().any(|h| h == f) || req.is_namespace {
        format!("namespace \"{}\"", req.namespace.unwrap_or(""))
    } else {
        req.what()
    }
}

fn namespace_message(
    req: &DeleteRequest<'_>,
    target: &SyncTarget,
    ns: &str,
    f: &SoftFinalizer,
    consequence: &str,
) -> String {
    let mut m = String::with_capacity(400);
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
                (Verdict::Allow(a), Ok(w)) => assert_eq!(a, w, "{}", r.name),
                (Verdict::Deny { rule, .. }, Err(w)) => assert_eq!(rule, w, "{}", r.name),
                _ => panic!("{}: got {got:?}, want {:?}", r.name, r.want),
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
            Verdict::Deny { message, .. } => message,
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
}
