//! The move-window pin on any decodable AdmissionReview, sent as a Deployment write and as a
//! scale request (read by `PinRequest::from_review`, as the webhook reads them), with one open
//! window using the Cluster API default selector, and with the MoveWindows not yet read.
//!
//! Invariants: no panic; a pin's JSONPatch (serialized, then applied with the `json-patch`
//! crate to the request's object JSON) applies and leaves `spec.replicas == 0`, and records a
//! saved count the policy can read back; deciding again on the patched object yields no ops.
//! The patch checks need the object in the shape the API server sends (see `k8s_shape`).
//! While the windows are unread nothing is pinned, and only a write the default selector
//! selects is refused (an app's scale-up passes); a write without its object is refused while
//! a window is open or could be.
#![no_main]

use std::collections::BTreeMap;
use std::sync::LazyLock;

use handoff::admission::{AdmissionRequest, ObjectView, Operation, PatchOp, decode_review};
use handoff::rules::move_window::{
    OpenWindow, OwnDeployment, ParentDeployment, PinReason, PinRequest, PinTarget, PinVerdict,
    SAVED_REPLICAS_ANNOTATION, SavedReplicas, Unseen, WindowView, decide,
};
use handoff::rules::selector::Selector;
use handoff::resources::move_window::default_deployment_selector;
use handoff::state::windows::DeploymentMeta;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

static WINDOWS: LazyLock<Vec<OpenWindow>> = LazyLock::new(|| {
    vec![OpenWindow {
        name: "capi-move".into(),
        selector: Selector::from_label_selector(&default_deployment_selector())
            .expect("the default selector compiles"),
    }]
});

static OWN: LazyLock<OwnDeployment> = LazyLock::new(|| OwnDeployment {
    namespace: "handoff-system".into(),
    name: "handoff".into(),
});

static CAPI_LABELS: LazyLock<BTreeMap<String, String>> = LazyLock::new(|| {
    BTreeMap::from([
        ("clusterctl.cluster.x-k8s.io".into(), String::new()),
        ("cluster.x-k8s.io/provider".into(), "cluster-api".into()),
    ])
});

fn is_object_or_absent(v: Option<&Value>, allow_null: bool) -> bool {
    match v {
        None => true,
        Some(Value::Null) => allow_null,
        Some(Value::Object(_)) => true,
        Some(_) => false,
    }
}

/// The object as the API server sends one: a JSON object whose `metadata` is an object, whose
/// `spec` and `metadata.annotations` are objects when present, and whose `spec.replicas` is an
/// int32 when present (the API server decodes the object before admission). The policy reads
/// other shapes leniently (serde's derived `Deserialize` even reads a struct from a JSON array,
/// and an unreadable `replicas` counts as "not given"), but no API server sends them.
fn k8s_shape(obj: &Value) -> bool {
    let Some(map) = obj.as_object() else {
        return false;
    };
    let Some(Value::Object(meta)) = map.get("metadata") else {
        return false;
    };
    let replicas_ok = match map.get("spec").and_then(|s| s.get("replicas")) {
        None | Some(Value::Null) => true,
        Some(v) => v.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
    };
    is_object_or_absent(map.get("spec"), true)
        && replicas_ok
        && is_object_or_absent(meta.get("annotations"), true)
}

fn is_zero(v: Option<&Value>) -> bool {
    v.is_some_and(|v| v.as_i64() == Some(0) || v.as_f64() == Some(0.0))
}

fn apply(obj: &Value, ops: &[PatchOp]) -> Value {
    let json = serde_json::to_value(ops).expect("PatchOps serialize");
    let patch: json_patch::Patch =
        serde_json::from_value(json.clone()).expect("PatchOps are RFC 6902 operations");
    let mut doc = obj.clone();
    if let Err(e) = json_patch::patch(&mut doc, &patch) {
        panic!("patch {json} does not apply to {obj}: {e}");
    }
    doc
}

/// `req` as the API server sends it to the pin: an UPDATE of `deployments/scale`, or a write of
/// `deployments` (its own operation when that is CREATE or UPDATE).
fn sent_as(req: &AdmissionRequest, scale: bool) -> AdmissionRequest {
    let mut r = req.clone();
    r.resource.group = "apps".into();
    r.resource.resource = "deployments".into();
    r.sub_resource = scale.then(|| "scale".into());
    if scale || !matches!(r.operation, Operation::Create | Operation::Update) {
        r.operation = Operation::Update;
    }
    r
}

/// `req` again, carrying `object` (the patched one).
fn with_object(req: &AdmissionRequest, object: ObjectView) -> AdmissionRequest {
    AdmissionRequest {
        object: Some(object),
        ..req.clone()
    }
}

/// While no MoveWindow has been read: nothing is pinned, and only what the default selector
/// could select is refused.
fn check_unread(pin: &PinRequest<'_>) {
    let unread = WindowView::new(&[], &[], &[], Some(Unseen::NotListed));
    let default = &WINDOWS[0].selector;
    let selected = match pin.target {
        PinTarget::Deployment { object, .. } => default.matches(object.metadata.labels.as_ref()),
        PinTarget::Scale {
            parent: ParentDeployment::Known { labels, .. },
            ..
        } => default.matches(labels),
        PinTarget::Scale { .. } => false,
        PinTarget::NoObject { .. } => true,
    };
    let own = pin.namespace == OWN.namespace && pin.name == OWN.name;
    match decide(pin, &unread, &OWN) {
        PinVerdict::Pin { .. } => panic!("pinned by a window nobody has read: {pin:?}"),
        PinVerdict::Deny { reason, .. } => assert!(
            match reason {
                PinReason::NoObject => matches!(pin.target, PinTarget::NoObject { .. }),
                PinReason::StateUnavailable => selected && !own,
                _ => false,
            },
            "refused a write no unseen window could select: {reason:?} {pin:?}"
        ),
        PinVerdict::Allow(reason) => assert!(
            !selected || own,
            "allowed {pin:?} while in doubt: {reason:?}"
        ),
    }
}

fn check_deployment(req: &AdmissionRequest, raw: Option<&Value>, pin: &PinRequest<'_>) {
    check_unread(pin);
    let PinVerdict::Pin {
        ops,
        restore_to,
        reason,
        ..
    } = decide(pin, &WindowView::known(&WINDOWS), &OWN)
    else {
        return;
    };
    let Some(raw) = raw.filter(|r| k8s_shape(r)) else {
        return;
    };
    let doc = apply(raw, &ops);
    assert!(
        is_zero(doc.pointer("/spec/replicas")),
        "pinned Deployment not at 0 replicas: {ops:?} -> {}",
        doc["spec"]
    );
    let saved_pointer = format!(
        "/metadata/annotations/{}",
        SAVED_REPLICAS_ANNOTATION.replace('/', "~1")
    );
    let before = raw.pointer(&saved_pointer);
    let saved = doc.pointer(&saved_pointer).and_then(Value::as_str);
    if reason == PinReason::PinnedUnreadableCount {
        // An unreadable saved count is left as it was, for `window close` to report; the
        // Deployment will be restored to 1.
        assert_eq!(
            doc.pointer(&saved_pointer),
            before,
            "unreadable count was rewritten"
        );
        assert!(
            saved.and_then(SavedReplicas::parse).is_none(),
            "{saved:?} is readable"
        );
        assert_eq!(restore_to, SavedReplicas(1));
    } else {
        assert_eq!(
            saved,
            Some(restore_to.to_string().as_str()),
            "saved count on the patched object is not the one reported"
        );
        assert_eq!(
            saved.and_then(SavedReplicas::parse),
            Some(restore_to),
            "the pin recorded a saved count that it cannot read back: {saved:?} (request uid {})",
            req.uid
        );
    }
    // Idempotence, on the shapes the policy is meant for.
    let spec_is_object = raw.get("spec").is_some_and(Value::is_object);
    let ann = raw.pointer("/metadata/annotations");
    if !(spec_is_object && is_object_or_absent(ann, false)) {
        return;
    }
    let patched: ObjectView =
        serde_json::from_value(doc.clone()).expect("the patched object still decodes");
    let sent = with_object(req, patched);
    let again = PinRequest::from_review(&sent).expect("still a Deployment write");
    match decide(&again, &WindowView::known(&WINDOWS), &OWN) {
        PinVerdict::Pin {
            ops: ops2,
            restore_to: r2,
            ..
        } => {
            assert!(
                ops2.is_empty(),
                "not idempotent: first {ops:?}, then {ops2:?} on {doc}"
            );
            assert_eq!(r2, restore_to, "second decision restores to another count");
        }
        v => panic!("the patched Deployment is no longer pinned: {v:?}"),
    }
}

fn check_scale(req: &AdmissionRequest, raw: Option<&Value>, pin: &PinRequest<'_>) {
    check_unread(pin);
    let PinTarget::Scale { parent, .. } = pin.target else {
        unreachable!()
    };
    let PinVerdict::Pin { ops, .. } = decide(pin, &WindowView::known(&WINDOWS), &OWN) else {
        return;
    };
    let Some(raw) = raw.filter(|r| k8s_shape(r)) else {
        return;
    };
    let doc = apply(raw, &ops);
    // autoscaling/v1 Scale: `replicas` is omitempty, so absent means 0.
    let r = doc.pointer("/spec/replicas");
    assert!(
        r.is_none() || r == Some(&Value::Null) || is_zero(r),
        "pinned scale not at 0 replicas: {ops:?} -> {}",
        doc["spec"]
    );
    let patched: ObjectView =
        serde_json::from_value(doc.clone()).expect("the patched object still decodes");
    let sent = with_object(req, patched);
    let again = PinRequest::from_review(&sent)
        .expect("still a scale request")
        .with_parent(parent);
    match decide(&again, &WindowView::known(&WINDOWS), &OWN) {
        PinVerdict::Pin { ops: ops2, .. } => assert!(
            ops2.is_empty(),
            "scale not idempotent: first {ops:?}, then {ops2:?} on {doc}"
        ),
        v => panic!("the patched scale is no longer pinned: {v:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = decode_review(data) else {
        return;
    };
    // serde skips unknown fields without checking their `\u` escapes, so a body that
    // `decode_review` accepts may still not parse as a `Value` (lone surrogates): no raw JSON
    // to patch then.
    let body: Option<Value> = serde_json::from_slice(data).ok();
    let raw = body.as_ref().and_then(|b| b.pointer("/request/object"));

    let write = sent_as(&req, false);
    let pin = PinRequest::from_review(&write).expect("a Deployment write");
    let Some(object) = req.object.as_ref() else {
        let PinTarget::NoObject { .. } = pin.target else {
            panic!("{pin:?} has an object the request does not")
        };
        check_unread(&pin);
        assert_eq!(
            decide(&pin, &WindowView::known(&[]), &OWN),
            PinVerdict::Allow(PinReason::NoOpenWindow)
        );
        assert!(matches!(
            decide(&pin, &WindowView::known(&WINDOWS), &OWN),
            PinVerdict::Deny {
                reason: PinReason::NoObject,
                ..
            }
        ));
        return;
    };
    check_deployment(&write, raw, &pin);

    // The parent as the Deployment cache keeps it, from the object's own metadata and from a
    // selected Deployment carrying the object's annotations.
    let own_meta = DeploymentMeta::new(
        object.metadata.labels.as_ref(),
        object.metadata.annotations.as_ref(),
    );
    let selected_meta =
        DeploymentMeta::new(Some(&CAPI_LABELS), object.metadata.annotations.as_ref());
    let parents = [
        ParentDeployment::Known {
            labels: own_meta.labels.as_ref(),
            annotations: own_meta.annotations.as_ref(),
            stale: None,
        },
        ParentDeployment::Known {
            labels: selected_meta.labels.as_ref(),
            annotations: selected_meta.annotations.as_ref(),
            stale: None,
        },
        ParentDeployment::Missing,
        ParentDeployment::Unavailable("the API server did not answer within 3s"),
    ];
    let scale = sent_as(&req, true);
    let pin = PinRequest::from_review(&scale).expect("a scale request");
    assert_eq!(
        pin.parent_to_read(&WindowView::known(&WINDOWS)),
        Some((pin.namespace, pin.name))
    );
    for parent in parents {
        check_scale(&scale, raw, &pin.with_parent(parent));
    }
});
