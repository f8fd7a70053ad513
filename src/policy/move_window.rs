//! The move-window pin (DESIGN §1.2): a pure function from a Deployment write (or a scale
//! request), the open windows and the parent Deployment's labels to a JSONPatch.

use std::collections::BTreeMap;
use std::fmt;

use crate::admission::{ObjectView, PatchOp, pointer};
use crate::policy::selector::Selector;

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

/// handoff's own Deployment, which is never pinned (it serves the webhook that would unpin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnDeployment {
    pub namespace: String,
    pub name: String,
}

/// What the edge knows of the Deployment behind a scale request.
#[derive(Debug, Clone, Copy)]
pub enum ParentDeployment<'a> {
    Known {
        labels: Option<&'a BTreeMap<String, String>>,
        annotations: Option<&'a BTreeMap<String, String>>,
    },
    /// No such Deployment: the API server will answer the scale with 404 anyway.
    Missing,
    Unavailable(&'a str),
}

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
}

#[derive(Debug, Clone, Copy)]
pub struct PinRequest<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub target: PinTarget<'a>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PinVerdict {
    Allow(&'static str),
    Pin {
        window: String,
        ops: Vec<PatchOp>,
        restore_to: SavedReplicas,
        warning: String,
        reason: &'static str,
    },
    Deny {
        reason: &'static str,
        message: String,
    },
}

/// Decide one write. Idempotent: a request that is already pinned gets no patch operations.
pub fn decide(req: &PinRequest<'_>, windows: &[OpenWindow], own: &OwnDeployment) -> PinVerdict {
    if windows.is_empty() {
        return PinVerdict::Allow("no-open-window");
    }
    if req.namespace == own.namespace && req.name == own.name {
        return PinVerdict::Allow("own-deployment");
    }
    let what = format!("{}/{}", req.namespace, req.name);
    match req.target {
        PinTarget::Deployment { object, old_object } => {
            let Some(w) = windows
                .iter()
                .find(|w| w.selector.matches(object.metadata.labels.as_ref()))
            else {
                return PinVerdict::Allow("not-selected");
            };
            let asked = object.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if asked < 0 {
                // Mutation runs before validation: pinning would turn an invalid write into a
                // valid one. Leave it for the API server to reject.
                return PinVerdict::Allow("invalid-replicas");
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
                let readable = SavedReplicas::from_annotations(
                    object.metadata.annotations.as_ref(),
                )
                .or_else(|| {
                    old_object.and_then(|o| {
                        SavedReplicas::from_annotations(o.metadata.annotations.as_ref())
                    })
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
                    reason: "pinned-unreadable-count",
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
                reason: "pinned",
            }
        }
        PinTarget::Scale { object, parent } => {
            let (labels, annotations) = match parent {
                ParentDeployment::Known {
                    labels,
                    annotations,
                } => (labels, annotations),
                ParentDeployment::Missing => return PinVerdict::Allow("no-such-deployment"),
                ParentDeployment::Unavailable(why) => {
                    return PinVerdict::Deny {
                        reason: "state-unavailable",
                        message: format!(
                            "a MoveWindow is open and handoff cannot read Deployment {what} to tell whether it is pinned ({why}); the scale request is refused rather than risk starting a controller mid-move"
                        ),
                    };
                }
            };
            let Some(w) = windows.iter().find(|w| w.selector.matches(labels)) else {
                return PinVerdict::Allow("not-selected");
            };
            let asked = object.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            if asked < 0 {
                return PinVerdict::Allow("invalid-replicas");
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
                reason: "pinned-scale",
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{ObjectMetaView, SpecView};
    use crate::window::resource::default_deployment_selector;

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
            let v = decide(&req, &windows(), &own());
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
                        &windows(),
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
                (PinVerdict::Allow(r), None) => assert_eq!(*r, "not-selected", "{name}"),
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
        let PinVerdict::Pin { ops, .. } = decide(&req, &windows(), &own()) else {
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
        let PinVerdict::Pin { ops, .. } = decide(&req, &windows(), &own()) else {
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
            decide(&req, &[], &own()),
            PinVerdict::Allow("no-open-window")
        );
        let mine = PinRequest {
            namespace: "handoff-system",
            name: "handoff",
            ..req
        };
        assert_eq!(
            decide(&mine, &windows(), &own()),
            PinVerdict::Allow("own-deployment")
        );
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
                },
                Ok((3, 1)),
            ),
            (
                "scale to 0 needs no patch",
                &s0,
                ParentDeployment::Known {
                    labels: Some(&labels),
                    annotations: Some(&saved),
                },
                Ok((3, 0)),
            ),
            (
                "no saved count: restored to 1",
                &s5,
                ParentDeployment::Known {
                    labels: Some(&labels),
                    annotations: None,
                },
                Ok((1, 1)),
            ),
            (
                "unselected parent passes",
                &s5,
                ParentDeployment::Known {
                    labels: None,
                    annotations: None,
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
                "unreadable parent is refused",
                &s5,
                ParentDeployment::Unavailable("timeout"),
                Err("state-unavailable"),
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
            let v = decide(&req, &windows(), &own());
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
                (PinVerdict::Allow(a), Err(w)) => assert_eq!(*a, w, "{name}"),
                (PinVerdict::Deny { reason, .. }, Err(w)) => assert_eq!(*reason, w, "{name}"),
                _ => panic!("{name}: {v:?}"),
            }
        }
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
            decide(&req, &windows(), &own()),
            PinVerdict::Allow("invalid-replicas")
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
                },
            },
            ..req
        };
        assert_eq!(
            decide(&req, &windows(), &own()),
            PinVerdict::Allow("invalid-replicas")
        );
    }

    #[test]
    fn saved_replicas_parse() {
        assert_eq!(SavedReplicas::parse(" 3 "), Some(SavedReplicas(3)));
        assert_eq!(SavedReplicas::parse("-1"), None);
        assert_eq!(SavedReplicas::parse("x"), None);
    }
}
