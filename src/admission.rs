//! AdmissionReview `admission.k8s.io/v1` in and out, and the one JSONPatch builder.
//!
//! The request types read only what the two webhooks decide on; serde skips the rest of the
//! object (managedFields, pod specs) without allocating, which keeps decoding cheap for the
//! 2 KB–20 KB bodies the API server sends.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// Why a body is not an AdmissionReview we can answer. Each is answered with HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not a valid AdmissionReview JSON document: {0}")]
    Json(#[from] serde_json::Error),
    #[error("AdmissionReview has no \"request\" field: nothing to decide")]
    MissingRequest,
    #[error(
        "AdmissionReview apiVersion {0:?} is not supported: register the webhook with admissionReviewVersions: [v1]"
    )]
    ApiVersion(String),
    #[error("body kind {0:?} is not an AdmissionReview")]
    Kind(String),
    #[error("AdmissionReview request has an empty uid: the API server always sends one")]
    MissingUid,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewEnvelope {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

/// Decode a body into its request, checking the envelope the way the API server writes it.
pub fn decode_review(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
    let env: ReviewEnvelope = serde_json::from_slice(body)?;
    match env.api_version.as_deref() {
        Some(API_VERSION) => {}
        other => return Err(ReviewError::ApiVersion(other.unwrap_or("").to_string())),
    }
    match env.kind.as_deref() {
        Some(KIND) => {}
        other => return Err(ReviewError::Kind(other.unwrap_or("").to_string())),
    }
    let request = env.request.ok_or(ReviewError::MissingRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    Ok(request)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// The username, and the groups that break-glass exemptions may name; `extra` is never read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// The parts of an object (a Deployment, a Scale, anything being deleted) the webhooks read.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectView {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMetaView,
    #[serde(default)]
    pub spec: Option<SpecView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMetaView {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Only the annotations a webhook reads (see `READ_ANNOTATION_PREFIXES`); the others are
    /// skipped unread. `Some` whenever the object has an `annotations` map, even if none of
    /// them is kept, since the pin's JSONPatch paths depend on whether the map exists.
    #[serde(default, deserialize_with = "read_annotations")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Annotation keys the webhooks read on a reviewed object: soft finalizers
/// (`finalizers.workload.<domain>/<key>`, whatever domains are configured) and handoff's own
/// (`handoff.dev/replicas-before-move`). Every other value is skipped while decoding: the
/// biggest of them, `kubectl.kubernetes.io/last-applied-configuration`, is an escaped copy of
/// the whole object, and copying and unescaping it was a measurable share of a review's cost.
pub const READ_ANNOTATION_PREFIXES: &[&str] = &["finalizers.workload.", "handoff.dev/"];

fn read_annotations<'de, D>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::{IgnoredAny, MapAccess, Visitor};

    struct Filter;
    impl<'de> Visitor<'de> for Filter {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<Key<'de>>()? {
                if READ_ANNOTATION_PREFIXES
                    .iter()
                    .any(|p| key.0.starts_with(p))
                {
                    out.insert(key.0.into_owned(), map.next_value::<String>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Filter)
}

/// A map key borrowed from the body when it has no escapes (nearly always), so that the keys
/// a visitor skips cost no allocation.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

impl ObjectMetaView {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }
}

/// `spec.replicas` is all either webhook reads of a spec; it is the same field on a Deployment
/// and on an `autoscaling/v1` Scale.
///
/// Decoding is lenient: the object being deleted may be any custom resource, whose `spec` can
/// be anything (a string, `replicas: "3"`, a number past i32). Such a shape reads as "no
/// replicas" instead of failing the whole review, which would refuse an unrelated delete.
#[derive(Debug, Clone, Default)]
pub struct SpecView {
    pub replicas: Option<i32>,
}

impl<'de> Deserialize<'de> for SpecView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess};
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SpecView;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SpecView, A::Error> {
                let mut replicas = None;
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    if key.0 == "replicas" {
                        let v: serde_json::Value = map.next_value()?;
                        replicas = v.as_i64().and_then(|n| i32::try_from(n).ok());
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(SpecView { replicas })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SpecView, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(SpecView::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<SpecView, E> {
                Ok(SpecView::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<SpecView, E> {
                Ok(SpecView::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<SpecView, E> {
                Ok(SpecView::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<SpecView, E> {
                Ok(SpecView::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<SpecView, E> {
                Ok(SpecView::default())
            }
            fn visit_unit<E>(self) -> Result<SpecView, E> {
                Ok(SpecView::default())
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// Absent (not empty) for the per-item calls of a delete-collection; empty for a
    /// collection-level call. Both mean "no single named object".
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<ObjectView>,
    #[serde(default)]
    pub old_object: Option<ObjectView>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl AdmissionRequest {
    pub fn is_dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }

    /// The name of the object acted on: the request's `name`, or for a delete-collection item
    /// the name in `oldObject`.
    pub fn object_name(&self) -> Option<&str> {
        match self.name.as_deref() {
            Some(n) if !n.is_empty() => Some(n),
            _ => self
                .old_object
                .as_ref()
                .or(self.object.as_ref())
                .and_then(|o| o.metadata.name.as_deref())
                .filter(|n| !n.is_empty()),
        }
    }

    /// `resource` or `resource/subresource`, as kubectl and audit logs write it.
    pub fn resource_path(&self) -> String {
        self.resource_display().to_string()
    }

    /// `resource_path` without building a `String`: the decision log writes it on every request.
    pub fn resource_display(&self) -> ResourcePath<'_> {
        ResourcePath(self)
    }
}

/// `resource[.group][/subresource]`, formatted in place.
pub struct ResourcePath<'a>(&'a AdmissionRequest);

impl std::fmt::Display for ResourcePath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.0.resource;
        f.write_str(&r.resource)?;
        if !r.group.is_empty() {
            write!(f, ".{}", r.group)?;
        }
        match self.0.sub_resource.as_deref() {
            Some(s) if !s.is_empty() => write!(f, "/{s}"),
            _ => Ok(()),
        }
    }
}

/// One JSONPatch (RFC 6902) operation. The only patch builder in handoff.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum PatchOp {
    Add {
        path: String,
        value: serde_json::Value,
    },
    Replace {
        path: String,
        value: serde_json::Value,
    },
    Remove {
        path: String,
    },
}

/// Escape one reference token of a JSON Pointer (RFC 6901): `~` → `~0`, `/` → `~1`.
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Build a JSON Pointer from raw tokens, escaping each.
pub fn pointer(tokens: &[&str]) -> String {
    let mut out = String::new();
    for t in tokens {
        out.push('/');
        out.push_str(&escape_pointer_token(t));
    }
    out
}

/// The verdict on the wire. `status` is set for denials, `patch` for mutations.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
}

/// The `metav1.Status` of a denial: kubectl prints `message` after
/// `admission webhook "…" denied the request: `.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl AdmissionResponse {
    pub fn allow(uid: &str) -> Self {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: true,
            ..Default::default()
        }
    }

    pub fn deny(uid: &str, code: u16, reason: &'static str, message: String) -> Self {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: false,
            status: Some(Status {
                code,
                reason,
                message,
            }),
            ..Default::default()
        }
    }

    /// Attach a JSONPatch, base64-encoded as the API contract requires. An empty patch is
    /// not sent at all.
    pub fn with_patch(mut self, ops: &[PatchOp]) -> Self {
        if !ops.is_empty() {
            let json = serde_json::to_vec(ops).expect("a JSONPatch always serializes");
            self.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
            self.patch_type = Some("JSONPatch");
        }
        self
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseEnvelope<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: &'a AdmissionResponse,
}

/// Encode a response AdmissionReview.
pub fn encode_review(response: &AdmissionResponse) -> Vec<u8> {
    serde_json::to_vec(&ResponseEnvelope {
        api_version: API_VERSION,
        kind: KIND,
        response,
    })
    .expect("an AdmissionResponse always serializes")
}

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("patch is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("patch is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Decode a response patch back into JSON (for `review` output checks and tests).
pub fn decode_patch(patch_b64: &str) -> Result<serde_json::Value, PatchError> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(patch_b64)?;
    Ok(serde_json::from_slice(&bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_escapes_slash_and_tilde() {
        assert_eq!(
            pointer(&[
                "metadata",
                "annotations",
                "handoff.dev/replicas-before-move"
            ]),
            "/metadata/annotations/handoff.dev~1replicas-before-move"
        );
        assert_eq!(escape_pointer_token("a~b/c"), "a~0b~1c");
    }

    #[test]
    fn decode_rejects_wrong_envelopes() {
        let cases: &[(&str, &str)] = &[
            ("{", "not a valid AdmissionReview JSON"),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                "no \"request\"",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u","operation":"DELETE"}}"#,
                "admission.k8s.io/v1beta1",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{"uid":"u","operation":"DELETE"}}"#,
                "\"Pod\" is not an AdmissionReview",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"","operation":"DELETE"}}"#,
                "empty uid",
            ),
            (
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"EXPLODE"}}"#,
                "EXPLODE",
            ),
        ];
        for (body, want) in cases {
            let err = decode_review(body.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
    }

    #[test]
    fn any_spec_shape_of_a_deleted_object_decodes() {
        for (spec, want) in [
            (r#""x""#, None),
            (r#"{"replicas":"3"}"#, None),
            (r#"{"replicas":5000000000}"#, None),
            (r#"{"replicas":2.5}"#, None),
            (r#"[1,{"a":2}]"#, None),
            ("true", None),
            ("7", None),
            ("null", None),
            (r#"{"other":{"deep":[1,2]},"replicas":4}"#, Some(4)),
            (r#"{"r\u0065plicas":6}"#, Some(6)),
        ] {
            let body = format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","operation":"DELETE","oldObject":{{"metadata":{{"name":"x"}},"spec":{spec}}}}}}}"#
            );
            let req = decode_review(body.as_bytes()).unwrap_or_else(|e| panic!("{spec}: {e}"));
            let replicas = req.old_object.unwrap().spec.and_then(|s| s.replicas);
            assert_eq!(replicas, want, "{spec}");
        }
    }

    #[test]
    fn decode_keeps_only_the_annotations_a_webhook_reads() {
        let review = |annotations: &str| {
            let body = format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","operation":"DELETE","oldObject":{{"metadata":{{"name":"n"{annotations}}}}}}}}}"#
            );
            decode_review(body.as_bytes())
                .unwrap()
                .old_object
                .unwrap()
                .metadata
                .annotations
        };
        let kept = review(
            r#","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"a\":[1,{\"b\":\"\\u00e9\"}]}","finalizers.workload.kcp.io/K":"hold","finalizers.workload.example.org/L":"","handoff.dev/replicas-before-move":"3","team":"x"}"#,
        )
        .unwrap();
        assert_eq!(
            kept,
            BTreeMap::from([
                ("finalizers.workload.example.org/L".into(), "".into()),
                ("finalizers.workload.kcp.io/K".into(), "hold".into()),
                ("handoff.dev/replicas-before-move".into(), "3".into()),
            ])
        );
        // A key written with JSON escapes (decoded into a fresh string, not borrowed) is
        // read the same as its plain spelling.
        assert_eq!(
            review(
                r#","annotations":{"\u0066inalizers.workload.kcp.io/K":"hold","te\u0061m":"x"}"#
            ),
            Some(BTreeMap::from([(
                "finalizers.workload.kcp.io/K".into(),
                "hold".into()
            )]))
        );
        // Presence is kept even when nothing is: the pin adds to the map or creates it.
        assert_eq!(
            review(r#","annotations":{"team":"x"}"#),
            Some(BTreeMap::new())
        );
        assert_eq!(review(r#","annotations":null"#), None);
        assert_eq!(review(""), None);
        // Every configured soft-finalizer prefix is kept by the decoder.
        for p in crate::rules::identity::Identities::new(
            &["kcp.io".into(), "kcp.dev".into(), "example.org".into()],
            &[],
        )
        .finalizer_prefixes()
        {
            assert!(
                READ_ANNOTATION_PREFIXES.iter().any(|k| p.starts_with(k)),
                "{p}"
            );
        }
    }

    #[test]
    fn patch_is_base64_jsonpatch() {
        let r = AdmissionResponse::allow("u").with_patch(&[PatchOp::Replace {
            path: "/spec/replicas".into(),
            value: 0.into(),
        }]);
        assert_eq!(r.patch_type, Some("JSONPatch"));
        let p = decode_patch(r.patch.as_deref().unwrap()).unwrap();
        assert_eq!(
            p,
            serde_json::json!([{"op":"replace","path":"/spec/replicas","value":0}])
        );
        let empty = AdmissionResponse::allow("u").with_patch(&[]);
        assert!(empty.patch.is_none() && empty.patch_type.is_none());
    }

    #[test]
    fn encode_echoes_uid_and_envelope() {
        let out = encode_review(&AdmissionResponse::deny(
            "abc",
            403,
            "Forbidden",
            "no".into(),
        ));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["response"]["uid"], "abc");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 403);
        assert_eq!(v["response"]["status"]["message"], "no");
    }
}
