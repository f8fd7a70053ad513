//! The kustomize manifests under `manifests/`, rendered by the real `kubectl kustomize`.
//!
//! Each kustomization is built from a copy of the `manifests/` tree in a temporary folder (the
//! local overlay's certificates are generated there by the real `handoff certs`, never in the
//! source tree). Every rendered object must be a kind we expect, must parse into its k8s-openapi
//! type, and must come back out of that type unchanged: a field that k8s-openapi does not know
//! (a typo, a field from a newer API, a wrong indentation) fails the test with its path. Then the
//! properties that docs/ARCHITECTURE.md and the operators rely on are checked on the typed objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, Probe, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const NAMESPACE: &str = "handoff-system";
const NAME_LABEL: &str = "app.kubernetes.io/name";
const LOCAL_CERTS: &str = "overlays/local/certs";

/// Everything one kustomization rendered, by kind.
#[derive(Default)]
struct Rendered {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    pdbs: Vec<PodDisruptionBudget>,
    validating: Vec<ValidatingWebhookConfiguration>,
    mutating: Vec<MutatingWebhookConfiguration>,
    crds: Vec<CustomResourceDefinition>,
    /// cert-manager.io/v1 (no k8s-openapi type): checked as JSON.
    issuers: Vec<Value>,
    certificates: Vec<Value>,
    /// `kind/name` of every object, in output order.
    ids: Vec<String>,
    /// `(kind, namespace, name)` of every object; no namespace for a cluster-scoped one.
    placed: Vec<(String, Option<String>, String)>,
}

/// A rendered kustomization, and the temporary copy of `manifests/` it was rendered from.
struct Build {
    objects: Rendered,
    root: tempfile::TempDir,
}

impl Build {
    fn manifests(&self) -> PathBuf {
        self.root.path().join("manifests")
    }
}

/// Copy `manifests/` into a temporary folder, prepare it, and run `kubectl kustomize` on
/// `kustomization` (a path under `manifests/`).
fn build(kustomization: &str) -> Build {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let root = tempfile::tempdir().expect("temporary folder");
    let manifests = root.path().join("manifests");
    copy_tree(&source, &manifests, &source.join(LOCAL_CERTS));

    if kustomization == "overlays/local" {
        let certs = manifests.join(LOCAL_CERTS);
        let out = Command::new(env!("CARGO_BIN_EXE_handoff"))
            .arg("certs")
            .arg("--out")
            .arg(&certs)
            .args(["--ip", "127.0.0.1", "--dns", "localhost"])
            .output()
            .expect("run handoff certs");
        assert!(
            out.status.success(),
            "handoff certs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for file in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
            assert!(certs.join(file).is_file(), "handoff certs wrote no {file}");
        }
    }

    let dir = manifests.join(kustomization);
    let out = match Command::new("kubectl").arg("kustomize").arg(&dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "kubectl is not on PATH ({e}): these tests render the manifests with \
             `kubectl kustomize` and cannot check them without it; install kubectl \
             (v1.27 or later, it carries kustomize v5) and put it on PATH"
        ),
        Err(e) => panic!("cannot run kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/{kustomization} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("kubectl printed UTF-8");
    Build {
        objects: parse_all(&text, kustomization),
        root,
    }
}

fn copy_tree(from: &Path, to: &Path, skip: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    for entry in entries {
        let entry = entry.expect("directory entry");
        let path = entry.path();
        if path == skip {
            // A developer's own generated certificates: the test makes fresh ones.
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&path, &target, skip);
        } else {
            std::fs::copy(&path, &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
        }
    }
}

/// Split kubectl's multi-document YAML and sort every object into its type.
fn parse_all(text: &str, kustomization: &str) -> Rendered {
    let mut rendered = Rendered::default();
    for (i, doc) in handoff::yaml::documents(text) {
        if handoff::yaml::is_empty(doc) {
            continue;
        }
        let mut value: Value = handoff::yaml::from_str(doc)
            .unwrap_or_else(|e| panic!("manifests/{kustomization}: document {i}: {e}"));
        let api_version = value["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let id = format!("{kind}/{name}");
        assert!(
            !api_version.is_empty() && !kind.is_empty() && !name.is_empty(),
            "manifests/{kustomization}: document {i} has no apiVersion, kind or name: {value}"
        );
        rendered.ids.push(id.clone());
        rendered.placed.push((
            kind.clone(),
            value["metadata"]["namespace"].as_str().map(str::to_owned),
            name.clone(),
        ));
        let place = format!("manifests/{kustomization}: {api_version} {id}");
        unwrap_ca_bundles(&mut value, &place);
        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Namespace") => rendered.namespaces.push(typed(&value, &place)),
            ("v1", "ServiceAccount") => rendered.service_accounts.push(typed(&value, &place)),
            ("v1", "Service") => rendered.services.push(typed(&value, &place)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                rendered.cluster_roles.push(typed(&value, &place))
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                rendered.cluster_role_bindings.push(typed(&value, &place))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => rendered.roles.push(typed(&value, &place)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                rendered.role_bindings.push(typed(&value, &place))
            }
            ("apps/v1", "Deployment") => rendered.deployments.push(typed(&value, &place)),
            ("policy/v1", "PodDisruptionBudget") => rendered.pdbs.push(typed(&value, &place)),
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
                rendered.validating.push(typed(&value, &place))
            }
            ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
                rendered.mutating.push(typed(&value, &place))
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                rendered.crds.push(typed(&value, &place))
            }
            ("cert-manager.io/v1", "Issuer") => {
                check_cert_manager_object(&value, &place);
                rendered.issuers.push(value)
            }
            ("cert-manager.io/v1", "Certificate") => {
                check_cert_manager_object(&value, &place);
                rendered.certificates.push(value)
            }
            _ => panic!("{place}: a kind these tests do not know; add it to tests/manifests.rs"),
        }
    }
    assert!(
        !rendered.ids.is_empty(),
        "manifests/{kustomization} rendered nothing"
    );
    rendered
}

/// kustomize writes the base64 of a secretGenerator's file wrapped at 70 columns, and the local
/// overlay's caBundle comes from one. The API server's decoder (Go's encoding/base64) skips line
/// breaks; k8s-openapi's does not. So, and only there, line breaks are checked to be the only
/// thing besides the base64 alphabet and then removed, before the strict checks below.
fn unwrap_ca_bundles(value: &mut Value, place: &str) {
    let Some(webhooks) = value.get_mut("webhooks").and_then(Value::as_array_mut) else {
        return;
    };
    for webhook in webhooks {
        let Some(bundle) = webhook.pointer_mut("/clientConfig/caBundle") else {
            continue;
        };
        let text = bundle
            .as_str()
            .unwrap_or_else(|| panic!("{place}: caBundle is not a string: {bundle}"));
        assert!(
            text.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '\n')),
            "{place}: caBundle has characters that are neither base64 nor line breaks: {text:?}"
        );
        *bundle = Value::String(text.replace('\n', ""));
    }
}

/// Parse `value` into `K`, and require that serializing `K` gives `value` back exactly.
fn typed<K: DeserializeOwned + Serialize>(value: &Value, place: &str) -> K {
    let object: K = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{place}: not a valid {}: {e}", std::any::type_name::<K>()));
    let back = serde_json::to_value(&object).expect("serialize a k8s-openapi object");
    let mut differences = Vec::new();
    compare("", value, &back, &mut differences);
    assert!(
        differences.is_empty(),
        "{place}: k8s-openapi does not read these fields back as written (a typo, a field \
         of another API version, or a wrong indentation):\n  {}",
        differences.join("\n  ")
    );
    object
}

/// Every difference between what kustomize rendered and what the typed object serializes to,
/// as `path: what`. Nothing is ignored.
fn compare(path: &str, rendered: &Value, typed: &Value, out: &mut Vec<String>) {
    match (rendered, typed) {
        (Value::Object(r), Value::Object(t)) => {
            for (key, value) in r {
                let here = format!("{path}.{key}");
                match t.get(key) {
                    Some(other) => compare(&here, value, other, out),
                    None => out.push(format!("{here}: dropped (rendered {value})")),
                }
            }
            for (key, value) in t {
                if !r.contains_key(key) {
                    out.push(format!("{path}.{key}: added by the type ({value})"));
                }
            }
        }
        (Value::Array(r), Value::Array(t)) => {
            if r.len() != t.len() {
                out.push(format!(
                    "{path}: {} items rendered, {} typed",
                    r.len(),
                    t.len()
                ));
            }
            for (i, (a, b)) in r.iter().zip(t).enumerate() {
                compare(&format!("{path}[{i}]"), a, b, out);
            }
        }
        (r, t) if r == t => {}
        (r, t) => out.push(format!("{path}: rendered {r}, typed {t}")),
    }
}

fn check_cert_manager_object(value: &Value, place: &str) {
    let metadata: ObjectMeta = typed(&value["metadata"], &format!("{place} metadata"));
    assert_eq!(metadata.namespace.as_deref(), Some(NAMESPACE), "{place}");
    assert!(value["spec"].is_object(), "{place}: no spec");
    let keys: Vec<&String> = value.as_object().expect("an object").keys().collect();
    assert_eq!(
        keys,
        ["apiVersion", "kind", "metadata", "spec"],
        "{place}: top-level fields"
    );
}

// ---------------------------------------------------------------------------------------------
// Shared checks

fn labels(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

fn name(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// The namespaceSelector keeps both webhooks out of kube-system and handoff-system.
fn assert_excludes_system_namespaces(selector: Option<&LabelSelector>, webhook: &str) {
    let selector = selector.unwrap_or_else(|| panic!("{webhook}: no namespaceSelector"));
    let excluded: Vec<&String> = selector
        .match_expressions
        .iter()
        .flatten()
        .filter(|e| e.key == "kubernetes.io/metadata.name" && e.operator == "NotIn")
        .flat_map(|e| e.values.iter().flatten())
        .collect();
    for ns in ["kube-system", NAMESPACE] {
        assert!(
            excluded.iter().any(|v| *v == ns),
            "{webhook}: namespaceSelector does not exclude {ns}: {selector:?}"
        );
    }
    assert!(
        selector.match_labels.is_none(),
        "{webhook}: matchLabels would narrow the webhook to labelled namespaces"
    );
}

struct Common<'a> {
    name: &'a str,
    client_config: &'a WebhookClientConfig,
    side_effects: &'a str,
    admission_review_versions: &'a [String],
    timeout_seconds: Option<i32>,
    namespace_selector: Option<&'a LabelSelector>,
}

impl<'a> From<&'a ValidatingWebhook> for Common<'a> {
    fn from(w: &'a ValidatingWebhook) -> Self {
        Common {
            name: &w.name,
            client_config: &w.client_config,
            side_effects: &w.side_effects,
            admission_review_versions: &w.admission_review_versions,
            timeout_seconds: w.timeout_seconds,
            namespace_selector: w.namespace_selector.as_ref(),
        }
    }
}

impl<'a> From<&'a MutatingWebhook> for Common<'a> {
    fn from(w: &'a MutatingWebhook) -> Self {
        Common {
            name: &w.name,
            client_config: &w.client_config,
            side_effects: &w.side_effects,
            admission_review_versions: &w.admission_review_versions,
            timeout_seconds: w.timeout_seconds,
            namespace_selector: w.namespace_selector.as_ref(),
        }
    }
}

/// Where each webhook entry sends its reviews (docs/ARCHITECTURE.md §1).
fn path_of(webhook: &str) -> &'static str {
    match webhook {
        "sync-finalizer.handoff.dev" => "/validate/sync-finalizer",
        "lease-hold.handoff.dev" => "/validate/lease-hold",
        "move-window.handoff.dev" | "move-window-scale.handoff.dev" => "/mutate/move-window",
        other => panic!("unexpected webhook {other}"),
    }
}

enum Endpoint {
    /// In the cluster: clientConfig.service handoff-system/handoff:443.
    Service,
    /// On the developer's machine: clientConfig.url on 127.0.0.1:8443 with this caBundle.
    Local { ca_pem: Vec<u8> },
}

fn all_webhooks(r: &Rendered) -> Vec<Common<'_>> {
    let mut all: Vec<Common<'_>> = Vec::new();
    for c in &r.validating {
        all.extend(c.webhooks.iter().flatten().map(Common::from));
    }
    for c in &r.mutating {
        all.extend(c.webhooks.iter().flatten().map(Common::from));
    }
    all
}

/// Both webhook configurations: names, rules, policies and CEL, the same in every overlay but
/// for the client configuration.
fn check_webhooks(r: &Rendered, endpoint: &Endpoint) {
    assert_eq!(
        r.validating.len(),
        1,
        "one ValidatingWebhookConfiguration: {:?}",
        r.ids
    );
    assert_eq!(
        r.mutating.len(),
        1,
        "one MutatingWebhookConfiguration: {:?}",
        r.ids
    );
    assert_eq!(name(&r.validating[0].metadata), "handoff");
    assert_eq!(name(&r.mutating[0].metadata), "handoff");

    let all = all_webhooks(r);
    let names: Vec<&str> = all.iter().map(|w| w.name).collect();
    assert_eq!(
        names,
        [
            "sync-finalizer.handoff.dev",
            "lease-hold.handoff.dev",
            "move-window.handoff.dev",
            "move-window-scale.handoff.dev"
        ]
    );
    for w in &all {
        assert_eq!(w.side_effects, "None", "{}: sideEffects", w.name);
        assert_eq!(
            w.admission_review_versions,
            ["v1"],
            "{}: admissionReviewVersions",
            w.name
        );
        let timeout = w
            .timeout_seconds
            .unwrap_or_else(|| panic!("{}: no timeoutSeconds", w.name));
        assert!(
            (1..=10).contains(&timeout),
            "{}: timeoutSeconds {timeout}",
            w.name
        );
        assert_excludes_system_namespaces(w.namespace_selector, w.name);

        let cc = w.client_config;
        match endpoint {
            Endpoint::Service => {
                let service = cc
                    .service
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}: no service", w.name));
                assert_eq!(service.namespace, NAMESPACE, "{}", w.name);
                let want = match w.name {
                    "sync-finalizer.handoff.dev" => "handoff-guard",
                    _ => "handoff-pin",
                };
                assert_eq!(
                    service.name, want,
                    "{}: the Service of its own Deployment",
                    w.name
                );
                assert_eq!(service.port, Some(443), "{}", w.name);
                assert_eq!(service.path.as_deref(), Some(path_of(w.name)), "{}", w.name);
                assert!(cc.url.is_none(), "{}: both service and url", w.name);
            }
            Endpoint::Local { ca_pem } => {
                assert!(
                    cc.service.is_none(),
                    "{}: the local overlay keeps a service",
                    w.name
                );
                let url = format!("https://127.0.0.1:8443{}", path_of(w.name));
                assert_eq!(cc.url.as_deref(), Some(url.as_str()), "{}", w.name);
                let bundle = cc
                    .ca_bundle
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}: no caBundle", w.name));
                assert!(
                    bundle.0 == *ca_pem,
                    "{}: caBundle decodes to\n{}\nnot the ca.crt that handoff certs wrote:\n{}",
                    w.name,
                    String::from_utf8_lossy(&bundle.0),
                    String::from_utf8_lossy(ca_pem)
                );
            }
        }
    }

    // The guard: DELETEs of every namespaced resource and of namespaces, by syncers only.
    let guard = &r.validating[0].webhooks.as_ref().unwrap()[0];
    assert_eq!(guard.failure_policy.as_deref(), Some("Fail"));
    let rules: Vec<_> = guard
        .rules
        .iter()
        .flatten()
        .map(|rule| {
            (
                rule.operations.clone().unwrap_or_default(),
                rule.api_groups.clone().unwrap_or_default(),
                rule.api_versions.clone().unwrap_or_default(),
                rule.resources.clone().unwrap_or_default(),
                rule.scope.clone().unwrap_or_default(),
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        [
            (
                s(&["DELETE"]),
                s(&["*"]),
                s(&["*"]),
                s(&["*/*"]),
                "Namespaced".to_string()
            ),
            (
                s(&["DELETE"]),
                s(&[""]),
                s(&["v1"]),
                s(&["namespaces"]),
                "Cluster".to_string()
            ),
        ]
    );
    let conditions = guard.match_conditions.as_deref().unwrap_or_default();
    assert_eq!(
        conditions.len(),
        1,
        "the guard's matchConditions: {conditions:?}"
    );
    let cel: Vec<&str> = conditions[0].expression.split_whitespace().collect();
    assert_eq!(
        cel.join(" "),
        "request.userInfo.username.startsWith('system:serviceaccount:') && \
         size(request.userInfo.username.split(':')) == 4 && \
         request.userInfo.username.split(':')[3].startsWith('kcp-syncer-')"
    );

    // The held-Lease guard: UPDATE and DELETE of Leases, and only of those a window holds.
    let hold = &r.validating[0].webhooks.as_ref().unwrap()[1];
    assert_eq!(hold.failure_policy.as_deref(), Some("Fail"));
    let rules = hold.rules.as_deref().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].operations, Some(s(&["UPDATE", "DELETE"])));
    assert_eq!(rules[0].api_groups, Some(s(&["coordination.k8s.io"])));
    assert_eq!(rules[0].resources, Some(s(&["leases"])));
    let held = hold
        .object_selector
        .as_ref()
        .and_then(|o| o.match_expressions.as_deref())
        .unwrap_or_default();
    assert!(
        held.iter()
            .any(|e| e.key == handoff::rules::lease_hold::HELD_BY_LABEL && e.operator == "Exists"),
        "the held-Lease entry must select held Leases only: {held:?}"
    );
    let excluded = hold
        .namespace_selector
        .as_ref()
        .and_then(|n| n.match_expressions.as_deref())
        .unwrap_or_default();
    assert!(
        excluded
            .iter()
            .any(|e| e.operator == "NotIn"
                && e.values.iter().flatten().any(|v| v == "kube-node-lease")),
        "never in the path of node heartbeats: {excluded:?}"
    );

    // The pin: Deployments (labelled provider controllers) and their scale subresource.
    let pin = r.mutating[0].webhooks.as_ref().unwrap();
    let (deployments, scale) = (&pin[0], &pin[1]);
    for w in pin {
        assert_eq!(
            w.reinvocation_policy.as_deref(),
            Some("IfNeeded"),
            "{}",
            w.name
        );
        let rules = w.rules.as_deref().unwrap_or_default();
        assert_eq!(rules.len(), 1, "{}", w.name);
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&["apps".to_string()][..]),
            "{}",
            w.name
        );
        assert_eq!(
            rules[0].api_versions.as_deref(),
            Some(&["v1".to_string()][..]),
            "{}",
            w.name
        );
    }
    // Installed for good, nothing fails closed for a Deployment outside a window: an open
    // window's own configuration does (`window_webhook`, tests/outage.rs).
    assert_eq!(deployments.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(
        deployments.rules.as_ref().unwrap()[0].operations,
        Some(s(&["CREATE", "UPDATE"]))
    );
    assert_eq!(
        deployments.rules.as_ref().unwrap()[0].resources,
        Some(s(&["deployments"]))
    );
    let selector = deployments
        .object_selector
        .as_ref()
        .expect("the Deployment entry selects provider controllers");
    let exprs = selector.match_expressions.as_deref().unwrap_or_default();
    assert!(
        exprs
            .iter()
            .any(|e| e.key == "cluster.x-k8s.io/provider" && e.operator == "Exists"),
        "objectSelector: {selector:?}"
    );
    assert!(deployments.match_conditions.is_none());

    // A Scale carries no labels: an objectSelector would never match (docs/ARCHITECTURE.md §1.2). It matches
    // every Deployment's scale, so it must not fail closed.
    assert_eq!(scale.failure_policy.as_deref(), Some("Ignore"));
    assert!(
        scale.object_selector.is_none(),
        "the scale entry must have no objectSelector"
    );
    assert_eq!(
        scale.rules.as_ref().unwrap()[0].operations,
        Some(s(&["UPDATE"]))
    );
    assert_eq!(
        scale.rules.as_ref().unwrap()[0].resources,
        Some(s(&["deployments/scale"]))
    );
    for c in scale.match_conditions.iter().flatten() {
        assert!(
            c.expression.contains("has(object.spec.replicas)"),
            "{}: a matchCondition that reads spec.replicas must guard it with has(): {}",
            c.name,
            c.expression
        );
    }
}

fn check_crd(r: &Rendered) {
    assert_eq!(r.crds.len(), 1, "{:?}", r.ids);
    let crd = &r.crds[0];
    assert_eq!(name(&crd.metadata), "movewindows.handoff.dev");
    assert_eq!(crd.spec.group, "handoff.dev");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, "MoveWindow");
    assert!(
        crd.spec
            .versions
            .iter()
            .any(|v| v.name == "v1alpha1" && v.served && v.storage)
    );
}

fn probe_get<'a>(probe: Option<&'a Probe>, what: &str) -> (&'a str, &'a IntOrString, &'a str) {
    let get = probe
        .and_then(|p| p.http_get.as_ref())
        .unwrap_or_else(|| panic!("no {what} httpGet"));
    (
        get.path.as_deref().unwrap_or_default(),
        &get.port,
        get.scheme.as_deref().unwrap_or("HTTP"),
    )
}

fn rules_of(role: &ClusterRole) -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    let key = |rule: &PolicyRule| {
        (
            rule.api_groups.clone().unwrap_or_default(),
            rule.resources.clone().unwrap_or_default(),
            rule.verbs.clone(),
        )
    };
    role.rules.iter().flatten().map(key).collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The in-cluster part of base and the cert-manager overlay.
fn check_in_cluster(r: &Rendered) {
    // Namespace, identity, least-privilege RBAC.
    assert_eq!(r.namespaces.len(), 1);
    assert_eq!(name(&r.namespaces[0].metadata), NAMESPACE);
    assert_eq!(
        labels(&r.namespaces[0].metadata)
            .get("kubernetes.io/metadata.name")
            .map(String::as_str),
        Some(NAMESPACE),
        "the namespace carries the label the webhooks exclude it by"
    );
    assert_eq!(
        r.service_accounts
            .iter()
            .map(|a| name(&a.metadata))
            .collect::<Vec<_>>(),
        ["handoff-guard", "handoff-pin"]
    );

    let role = |n: &str| {
        r.cluster_roles
            .iter()
            .find(|c| name(&c.metadata) == n)
            .unwrap_or_else(|| panic!("no ClusterRole {n}"))
    };
    let read = strings(&["get", "list", "watch"]);
    assert_eq!(
        rules_of(role("handoff-guard")),
        [(strings(&[""]), strings(&["namespaces"]), read.clone())],
        "the guard's ClusterRole is read-only on exactly what it caches"
    );
    assert_eq!(
        rules_of(role("handoff-pin")),
        [
            (strings(&["apps"]), strings(&["deployments"]), read.clone()),
            (
                strings(&["handoff.dev"]),
                strings(&["movewindows"]),
                read.clone()
            ),
        ],
        "the pin's ClusterRole is read-only on exactly what it caches"
    );
    assert!(role("handoff-guard").aggregation_rule.is_none());
    assert!(role("handoff-pin").aggregation_rule.is_none());
    let operator = role("handoff-window-operator");
    assert!(operator.aggregation_rule.is_none());
    for (group, resource, verb) in [
        ("handoff.dev", "movewindows", "create"),
        ("handoff.dev", "movewindows/status", "update"),
        ("apps", "deployments", "patch"),
        ("apps", "deployments/scale", "update"),
        ("", "pods", "list"),
        ("", "services", "list"),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "list",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "list",
        ),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        (
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicies",
            "get",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings",
            "create",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings",
            "delete",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "get",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "create",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "patch",
        ),
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "delete",
        ),
        ("authentication.k8s.io", "selfsubjectreviews", "create"),
        ("discovery.k8s.io", "endpointslices", "list"),
    ] {
        assert!(
            rules_of(operator)
                .iter()
                .any(|(g, res, v)| g.iter().any(|x| x == group)
                    && res.iter().any(|x| x == resource)
                    && v.iter().any(|x| x == verb)),
            "handoff-window-operator cannot {verb} {resource}"
        );
    }
    // Lease writes are a role of their own, for RoleBindings in the providers' namespaces:
    // the cluster-wide operator role writes no Lease anywhere.
    assert!(
        !rules_of(operator)
            .iter()
            .any(|(_, res, _)| res.iter().any(|x| x == "leases")),
        "handoff-window-operator must not write Leases cluster-wide"
    );
    assert_eq!(
        rules_of(role("handoff-window-operator-leases")),
        [
            (
                strings(&["coordination.k8s.io"]),
                strings(&["leases"]),
                strings(&["get", "list", "patch"])
            ),
            (
                strings(&[""]),
                strings(&["pods"]),
                strings(&["get", "list", "watch", "delete"])
            )
        ]
    );
    assert_eq!(
        r.cluster_role_bindings.len(),
        2,
        "only the servers' roles are bound"
    );
    for server in ["handoff-guard", "handoff-pin"] {
        let binding = r
            .cluster_role_bindings
            .iter()
            .find(|b| name(&b.metadata) == server)
            .unwrap_or_else(|| panic!("no ClusterRoleBinding {server}"));
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, server);
        let subjects = binding.subjects.as_deref().unwrap_or_default();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, server);
        assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));
    }

    // The guard's one write: the policy parameter ConfigMap, by name, in its own namespace.
    assert_eq!(r.roles.len(), 1);
    let params = &r.roles[0];
    assert_eq!(name(&params.metadata), "handoff-guard-policy-params");
    assert_eq!(params.metadata.namespace.as_deref(), Some(NAMESPACE));
    let rules = params.rules.as_deref().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&strings(&["configmaps"])[..])
    );
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&strings(&["handoff-sync-targets"])[..])
    );
    assert_eq!(rules[0].verbs, strings(&["get", "patch"]));
    assert_eq!(r.role_bindings.len(), 1);
    let rb = &r.role_bindings[0];
    assert_eq!(rb.role_ref.name, "handoff-guard-policy-params");
    let subjects = rb.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].name, "handoff-guard");

    // One Deployment, Service and PodDisruptionBudget per webhook (docs/ARCHITECTURE.md §1.3).
    assert_eq!(r.deployments.len(), 2);
    assert_eq!(r.pdbs.len(), 2);
    assert_eq!(r.services.len(), 2);
    for (server, component, webhook, own) in [
        ("handoff-guard", "guard", "sync-finalizer", None),
        (
            "handoff-pin",
            "pin",
            "move-window",
            Some("$(POD_NAMESPACE)/handoff-pin"),
        ),
    ] {
        check_server(r, server, component, webhook, own);
    }
}

/// One webhook's Deployment, its PodDisruptionBudget and its Service.
fn check_server(r: &Rendered, server: &str, component: &str, webhook: &str, own: Option<&str>) {
    // The Deployment.
    let deployment = r
        .deployments
        .iter()
        .find(|d| name(&d.metadata) == server)
        .unwrap_or_else(|| panic!("no Deployment {server}"));
    let spec = deployment.spec.as_ref().expect("Deployment spec");
    assert_eq!(spec.replicas, Some(3));
    let pod_labels = labels(
        spec.template
            .metadata
            .as_ref()
            .expect("pod template metadata"),
    );
    let selects = |selector: &LabelSelector, what: &str| {
        assert!(selector.match_expressions.is_none(), "{what}");
        let wanted = selector.match_labels.clone().unwrap_or_default();
        assert!(!wanted.is_empty(), "{what}: an empty selector");
        for (k, v) in &wanted {
            assert_eq!(
                pod_labels.get(k),
                Some(v),
                "{what} does not select the pods"
            );
        }
    };
    selects(&spec.selector, "the Deployment's selector");
    assert_eq!(
        pod_labels.get(NAME_LABEL).map(String::as_str),
        Some("handoff")
    );
    assert_eq!(
        pod_labels
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some(component),
        "{server}: the component label keeps the two Deployments' pods apart"
    );

    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(server));
    assert!(pod.priority_class_name.is_none());
    let grace = pod
        .termination_grace_period_seconds
        .expect("terminationGracePeriodSeconds");
    assert!(
        grace >= 5 + 20,
        "grace {grace}s is shorter than drain delay + drain timeout"
    );
    let affinity = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("pod anti-affinity");
    let terms: Vec<_> = affinity
        .required_during_scheduling_ignored_during_execution
        .iter()
        .flatten()
        .chain(
            affinity
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .map(|w| &w.pod_affinity_term),
        )
        .collect();
    assert!(
        terms
            .iter()
            .any(|t| t.topology_key == "kubernetes.io/hostname"
                && t.label_selector.as_ref().is_some_and(|s| {
                    s.match_labels
                        .iter()
                        .flatten()
                        .all(|(k, v)| pod_labels.get(k) == Some(v))
                })),
        "anti-affinity on hostname against the handoff pods: {affinity:?}"
    );

    assert_eq!(pod.containers.len(), 1);
    let c: &Container = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some(IMAGE.as_str()));
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let mut args = strings(&[
        "serve",
        "--listen",
        "0.0.0.0:8443",
        "--tls-cert",
        "/etc/handoff/tls/tls.crt",
        "--tls-key",
        "/etc/handoff/tls/tls.key",
        "--metrics-listen",
        "0.0.0.0:9090",
        "--log-format",
        "json",
        "--webhooks",
        webhook,
    ]);
    if let Some(own) = own {
        args.extend(strings(&["--own-deployment", own]));
    }
    assert_eq!(c.args.as_deref().unwrap_or_default(), args, "{server}");
    let env = c.env.as_deref().unwrap_or_default();
    let pod_namespace = env
        .iter()
        .find(|e| e.name == "POD_NAMESPACE")
        .expect("POD_NAMESPACE");
    assert_eq!(
        pod_namespace
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.namespace")
    );
    let ports: Vec<(Option<&str>, i32)> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect();
    assert_eq!(ports, [(Some("https"), 8443), (Some("metrics"), 9090)]);
    let https = IntOrString::Int(8443);
    assert_eq!(
        probe_get(c.liveness_probe.as_ref(), "liveness"),
        ("/healthz", &https, "HTTPS")
    );
    assert_eq!(
        probe_get(c.readiness_probe.as_ref(), "readiness"),
        ("/readyz", &https, "HTTPS")
    );

    let sc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(65532));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(strings(&["ALL"]))
    );
    assert!(sc.capabilities.as_ref().is_some_and(|c| c.add.is_none()));
    assert_eq!(sc.privileged, None);
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );

    let resources = c.resources.as_ref().expect("resources");
    let get =
        |m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
         k: &str| m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone());
    assert_eq!(get(&resources.requests, "cpu").as_deref(), Some("50m"));
    assert_eq!(get(&resources.requests, "memory").as_deref(), Some("64Mi"));
    assert_eq!(get(&resources.limits, "memory").as_deref(), Some("256Mi"));
    assert_eq!(
        get(&resources.limits, "cpu"),
        None,
        "no CPU limit: throttling adds latency"
    );

    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/etc/handoff/tls")
        .expect("the TLS mount");
    assert_eq!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("the TLS volume");
    assert_eq!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref()),
        Some("handoff-tls")
    );

    // PodDisruptionBudget and Service.
    let pdb = r
        .pdbs
        .iter()
        .find(|p| name(&p.metadata) == server)
        .unwrap_or_else(|| panic!("no PodDisruptionBudget {server}"))
        .spec
        .as_ref()
        .expect("PDB spec");
    assert!(
        pdb.min_available == Some(IntOrString::Int(2))
            || pdb.max_unavailable == Some(IntOrString::Int(1)),
        "PDB: {pdb:?}"
    );
    selects(
        pdb.selector.as_ref().expect("PDB selector"),
        "the PDB's selector",
    );

    let service = r
        .services
        .iter()
        .find(|x| name(&x.metadata) == server)
        .unwrap_or_else(|| panic!("no Service {server}"));
    let spec = service.spec.as_ref().expect("Service spec");
    let selector = LabelSelector {
        match_labels: spec.selector.clone(),
        ..Default::default()
    };
    selects(&selector, "the Service's selector");
    let ports: Vec<(Option<&str>, i32, Option<&IntOrString>)> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.port, p.target_port.as_ref()))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("https"), 443, Some(&IntOrString::Int(8443))),
            (Some("metrics"), 9090, Some(&IntOrString::Int(9090))),
        ]
    );
}

/// Names, namespaces and labels of everything the base renders.
fn check_metadata(r: &Rendered) {
    let metas = r
        .namespaces
        .iter()
        .map(|o| (&o.metadata, false))
        .chain(r.service_accounts.iter().map(|o| (&o.metadata, true)))
        .chain(r.deployments.iter().map(|o| (&o.metadata, true)))
        .chain(r.services.iter().map(|o| (&o.metadata, true)))
        .chain(r.pdbs.iter().map(|o| (&o.metadata, true)))
        .chain(r.cluster_roles.iter().map(|o| (&o.metadata, false)))
        .chain(r.cluster_role_bindings.iter().map(|o| (&o.metadata, false)))
        .chain(r.validating.iter().map(|o| (&o.metadata, false)))
        .chain(r.mutating.iter().map(|o| (&o.metadata, false)))
        .chain(r.crds.iter().map(|o| (&o.metadata, false)));
    for (meta, namespaced) in metas {
        let expected = namespaced.then_some(NAMESPACE);
        assert_eq!(
            meta.namespace.as_deref(),
            expected,
            "{}: namespace",
            name(meta)
        );
        assert_eq!(
            labels(meta).get(NAME_LABEL).map(String::as_str),
            Some("handoff"),
            "{}: label {NAME_LABEL}",
            name(meta)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The kustomizations

#[test]
fn base_renders_typed_objects_that_keep_every_field() {
    let build = build("base");
    let r = &build.objects;
    let mut kinds: Vec<&str> = r
        .ids
        .iter()
        .map(|id| id.split('/').next().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Deployment",
            "MutatingWebhookConfiguration",
            "Namespace",
            "PodDisruptionBudget",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
            "ValidatingWebhookConfiguration"
        ]
    );
    check_metadata(r);
    check_in_cluster(r);
    check_webhooks(r, &Endpoint::Service);
    check_crd(r);
    for config in r
        .validating
        .iter()
        .map(|c| &c.metadata)
        .chain(r.mutating.iter().map(|c| &c.metadata))
    {
        assert!(
            config.annotations.as_ref().is_none_or(|a| a.is_empty()),
            "base webhook configurations carry no annotations: {:?}",
            config.annotations
        );
    }
    for w in all_webhooks(r) {
        assert!(
            w.client_config.ca_bundle.is_none(),
            "{}: a caBundle in the base",
            w.name
        );
    }
}

#[test]
fn base_includes_the_generated_crd_unchanged() {
    let build = build("base");
    let file = std::fs::read_to_string(build.manifests().join("base/movewindow-crd.yaml"))
        .expect("manifests/base/movewindow-crd.yaml");
    let written: CustomResourceDefinition = handoff::yaml::from_str(&file).expect("the CRD file");
    let mut rendered = build.objects.crds[0].clone();
    // The only change kustomize makes: the common label.
    let labels = rendered.metadata.labels.take().unwrap_or_default();
    assert_eq!(labels.len(), 1, "{labels:?}");
    assert_eq!(labels.get(NAME_LABEL).map(String::as_str), Some("handoff"));
    assert!(
        rendered == written,
        "kustomize changed the MoveWindow CRD beyond its labels"
    );
}

#[test]
fn cert_manager_overlay_issues_the_serving_certificate_and_injects_the_ca() {
    let build = build("overlays/cert-manager");
    let r = &build.objects;
    check_metadata(r);
    check_in_cluster(r);
    check_webhooks(r, &Endpoint::Service);
    check_crd(r);

    for meta in r
        .validating
        .iter()
        .map(|c| &c.metadata)
        .chain(r.mutating.iter().map(|c| &c.metadata))
    {
        let annotations = meta.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get("cert-manager.io/inject-ca-from")
                .map(String::as_str),
            Some("handoff-system/handoff"),
            "{}: {annotations:?}",
            name(meta)
        );
    }

    let by_name = |list: &[Value], n: &str| -> Value {
        list.iter()
            .find(|o| o["metadata"]["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no {n} in {list:?}"))
    };
    let certificate = by_name(&r.certificates, "handoff");
    let spec = &certificate["spec"];
    assert_eq!(
        spec["secretName"], "handoff-tls",
        "the Secret the Deployment mounts"
    );
    assert_eq!(
        spec["dnsNames"],
        serde_json::json!([
            "handoff-guard.handoff-system.svc",
            "handoff-guard.handoff-system.svc.cluster.local",
            "handoff-pin.handoff-system.svc",
            "handoff-pin.handoff-system.svc.cluster.local"
        ])
    );
    assert_eq!(spec["privateKey"]["rotationPolicy"], "Always");
    let hours = |v: &Value| -> u64 {
        let s = v.as_str().unwrap_or_else(|| panic!("not a duration: {v}"));
        s.strip_suffix('h')
            .and_then(|h| h.parse().ok())
            .unwrap_or_else(|| panic!("{s:?}: write durations in whole hours"))
    };
    let (duration, renew) = (hours(&spec["duration"]), hours(&spec["renewBefore"]));
    assert!(
        renew < duration && duration <= 24 * 397,
        "duration {duration}h, renewBefore {renew}h"
    );
    assert!(
        renew >= 24 * 7,
        "renewBefore {renew}h leaves too little time to notice a failure"
    );

    // Its issuer exists in the overlay and is either self-signed or a CA whose key pair comes
    // from a CA Certificate issued by a self-signed Issuer.
    assert_eq!(spec["issuerRef"]["kind"], "Issuer");
    let issuer = by_name(
        &r.issuers,
        spec["issuerRef"]["name"].as_str().expect("issuerRef.name"),
    );
    if issuer["spec"].get("selfSigned").is_none() {
        let ca_secret = issuer["spec"]["ca"]["secretName"]
            .as_str()
            .expect("a CA Issuer");
        let ca = r
            .certificates
            .iter()
            .find(|c| c["spec"]["secretName"] == ca_secret)
            .expect("a Certificate that makes the CA Issuer's secret");
        assert_eq!(ca["spec"]["isCA"], true);
        let root = by_name(
            &r.issuers,
            ca["spec"]["issuerRef"]["name"].as_str().unwrap(),
        );
        assert!(
            root["spec"]["selfSigned"].is_object(),
            "the CA is self-signed: {root}"
        );
    }
    assert!(
        r.issuers
            .iter()
            .any(|i| i["spec"]["selfSigned"].is_object()),
        "a selfSigned Issuer"
    );
}

#[test]
fn local_overlay_points_the_webhooks_at_the_binary_on_loopback() {
    let build = build("overlays/local");
    let r = &build.objects;
    let mut kinds: Vec<&str> = r
        .ids
        .iter()
        .map(|id| id.split('/').next().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "CustomResourceDefinition",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ],
        "only the CRD and the webhook configurations go into the cluster (no Deployment, \
         Service, PDB, ServiceAccount, RBAC, Namespace, nor the generator's Secret)"
    );
    assert!(r.deployments.is_empty());
    check_metadata(r);
    check_crd(r);
    let ca_pem = std::fs::read(build.manifests().join(LOCAL_CERTS).join("ca.crt"))
        .expect("the ca.crt handoff certs wrote");
    assert!(ca_pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
    check_webhooks(r, &Endpoint::Local { ca_pem });
}

#[test]
fn the_local_certificates_stay_out_of_the_source_tree() {
    let ignore = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".gitignore"))
        .expect(".gitignore");
    assert!(
        ignore
            .lines()
            .any(|l| l.trim() == "manifests/overlays/local/certs/"),
        ".gitignore must ignore manifests/overlays/local/certs/"
    );
}

/// The released image, tagged with the crate's version: Cargo.toml is the one place to bump.
static IMAGE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{IMAGE_NAME}:{}", env!("CARGO_PKG_VERSION")));
const IMAGE_NAME: &str = "ghcr.io/handoff-dev/handoff";

#[test]
fn release_files_carry_the_crate_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = env!("CARGO_PKG_VERSION");
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|l| l == format!("ARG VERSION={version}")),
        "the Dockerfile's `ARG VERSION=` is not {version}"
    );
    for line in [
        "FROM scratch",
        "USER 65532:65532",
        r#"ENTRYPOINT ["/handoff"]"#,
    ] {
        assert!(
            dockerfile.lines().any(|l| l == line),
            "Dockerfile: no {line:?}"
        );
    }
    for label in ["source", "version", "licenses"] {
        assert!(
            dockerfile.contains(&format!("org.opencontainers.image.{label}=")),
            "Dockerfile: no {label} label"
        );
    }
    let krew: Value = handoff::yaml::from_str(
        &std::fs::read_to_string(root.join("plugins/krew/handoff.yaml")).expect("krew manifest"),
    )
    .expect("the krew manifest parses");
    assert_eq!(
        krew["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(krew["kind"], "Plugin");
    assert_eq!(krew["spec"]["version"], format!("v{version}"));
    let uri = krew["spec"]["platforms"][0]["uri"]
        .as_str()
        .unwrap_or_default();
    assert!(uri.contains(&format!("/v{version}/")), "{uri}");
}

#[test]
fn kustomize_images_points_the_deployment_at_another_registry() {
    let build = build("base");
    let overlay = build.root.path().join("private");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources: [../manifests/base]\nimages:\n  - name: {IMAGE_NAME}\n    newName: registry.example.com/platform/handoff\n    newTag: 0.1.0-patched\n"
        ),
    )
    .unwrap();
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let objects = parse_all(&text, "private");
    let images: Vec<_> = objects
        .deployments
        .iter()
        .flat_map(|d| d.spec.iter().flat_map(|s| s.template.spec.iter()))
        .flat_map(|p| p.containers.iter().map(|c| c.image.clone()))
        .collect();
    let patched = Some("registry.example.com/platform/handoff:0.1.0-patched".to_string());
    assert_eq!(
        images,
        [patched.clone(), patched],
        "both Deployments follow the images: override"
    );
}

#[test]
fn kcp_overlay_gives_the_guard_the_kcp_kubeconfig_and_the_mirror_exactly_patch_on_namespaces() {
    let build = build("overlays/kcp");
    let r = &build.objects;
    check_metadata(r);
    check_webhooks(r, &Endpoint::Service);
    check_crd(r);
    let base = build_objects_of("base");

    // The guard: the flag, and the Secret mounted read-only where the flag points.
    let deployment = |r: &Rendered, n: &str| -> Deployment {
        r.deployments
            .iter()
            .find(|d| name(&d.metadata) == n)
            .unwrap_or_else(|| panic!("no Deployment {n}"))
            .clone()
    };
    let guard = deployment(r, "handoff-guard");
    let pod = guard.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default();
    let base_guard = deployment(&base, "handoff-guard");
    let base_args = base_guard
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert_eq!(
        args,
        [
            base_args,
            strings(&["--kcp-kubeconfig", "/etc/handoff/kcp/kubeconfig"])
        ]
        .concat(),
        "the base's arguments and the kcp flag"
    );
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "kcp-kubeconfig")
        .expect("kcp kubeconfig mounted");
    assert_eq!(mount.mount_path, "/etc/handoff/kcp");
    assert_eq!(mount.read_only, Some(true));
    assert!(
        c.volume_mounts.iter().flatten().any(|m| m.name == "tls"),
        "the serving certificate is still mounted"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "kcp-kubeconfig")
        .expect("kcp kubeconfig volume");
    assert_eq!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref()),
        Some("handoff-kcp-kubeconfig")
    );
    // The pin is the base's.
    assert_eq!(
        serde_json::to_value(deployment(r, "handoff-pin")).unwrap(),
        serde_json::to_value(deployment(&base, "handoff-pin")).unwrap()
    );

    // RBAC: the base's roles unchanged, plus patch on namespaces for the mirror, bound to the
    // guard's ServiceAccount only.
    let role = |r: &Rendered, n: &str| {
        r.cluster_roles
            .iter()
            .find(|c| name(&c.metadata) == n)
            .map(rules_of)
    };
    for n in [
        "handoff-guard",
        "handoff-pin",
        "handoff-window-operator",
        "handoff-window-operator-leases",
    ] {
        assert_eq!(role(r, n), role(&base, n), "{n}");
    }
    assert_eq!(
        role(r, "handoff-guard-kcp-mirror"),
        Some(vec![(
            strings(&[""]),
            strings(&["namespaces"]),
            strings(&["patch"])
        )]),
        "the mirror may patch namespaces and nothing else (no create: an apply cannot bring a namespace back)"
    );
    let binding = r
        .cluster_role_bindings
        .iter()
        .find(|b| name(&b.metadata) == "handoff-guard-kcp-mirror")
        .expect("mirror binding");
    assert_eq!(binding.role_ref.name, "handoff-guard-kcp-mirror");
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (
            subjects[0].kind.as_str(),
            subjects[0].name.as_str(),
            subjects[0].namespace.as_deref()
        ),
        ("ServiceAccount", "handoff-guard", Some(NAMESPACE))
    );
    assert_eq!(r.cluster_role_bindings.len(), 3);
}

fn build_objects_of(kustomization: &str) -> Rendered {
    build(kustomization).objects
}

/// `(Kind, name)` of every object a `kubectl delete` line of `text`'s ```` ```sh ```` blocks
/// deletes (`kubectl delete KIND[,KIND] NAME... [--flags]`, lines joined at a trailing `\`);
/// commented-out lines say what a reader may do, not what the page does, and count for nothing.
fn deleted_by(text: &str) -> std::collections::BTreeSet<(String, String)> {
    let kind_of = |k: &str| -> String {
        match k.trim_end_matches('s') {
            "namespace" | "n" => "Namespace",
            "clusterrole" => "ClusterRole",
            "clusterrolebinding" => "ClusterRoleBinding",
            "validatingwebhookconfiguration" => "ValidatingWebhookConfiguration",
            "mutatingwebhookconfiguration" => "MutatingWebhookConfiguration",
            "crd" | "customresourcedefinition" => "CustomResourceDefinition",
            other => panic!("a kubectl delete of a kind this test does not know: {other}"),
        }
        .to_owned()
    };
    let mut deleted = std::collections::BTreeSet::new();
    let mut in_sh = false;
    let mut line = String::new();
    for raw in text.lines() {
        let t = raw.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        line.push_str(t.trim_end_matches('\\'));
        line.push(' ');
        if t.ends_with('\\') {
            continue;
        }
        let words: Vec<&str> = line
            .split_whitespace()
            .take_while(|w| !w.starts_with('#'))
            .collect();
        if let ["kubectl", "delete", kinds, rest @ ..] = words.as_slice() {
            let names: Vec<&str> = rest
                .iter()
                .copied()
                .filter(|w| !w.starts_with('-'))
                .collect();
            for k in kinds.split(',') {
                for n in &names {
                    deleted.insert((kind_of(k), (*n).to_owned()));
                }
            }
        }
        line.clear();
    }
    deleted
}

/// "Remove handoff completely" (`docs/src/tasks/remove.md`) deletes every object that the base
/// and the kcp and cert-manager overlays install: each cluster-scoped one by name, each
/// namespaced one with its namespace. (The `local` overlay installs a part of the base; the
/// `monitoring` one, objects in handoff-system only.) (The admission policies go with `handoff policy uninstall`, which
/// tests/admission_policy.rs drives; a Helm release goes with `helm uninstall`, tests/helm.rs.)
#[test]
fn the_remove_page_deletes_everything_the_manifests_install() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/tasks/remove.md"),
    )
    .expect("docs/src/tasks/remove.md");
    let deleted = deleted_by(&page);
    assert!(
        deleted.contains(&("Namespace".to_owned(), NAMESPACE.to_owned())),
        "the page deletes no namespace {NAMESPACE}: {deleted:?}"
    );
    let mut missing = Vec::new();
    for kustomization in ["base", "overlays/kcp", "overlays/cert-manager"] {
        for (kind, namespace, name) in build_objects_of(kustomization).placed {
            let needed = match &namespace {
                Some(ns) => ("Namespace".to_owned(), ns.clone()),
                None => (kind.clone(), name.clone()),
            };
            if !deleted.contains(&needed) {
                missing.push(format!("manifests/{kustomization}: {kind}/{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/src/tasks/remove.md leaves these behind: {missing:#?}"
    );
}

#[test]
fn deleted_by_reads_the_lines_a_reader_runs() {
    let page = "text kubectl delete crd a\n```sh\nkubectl delete clusterrole x \\\n  y --ignore-not-found # z\n# kubectl delete crd c\nkubectl delete clusterrolebinding,clusterrole m\nkubectl get ns\n```\n";
    let got: Vec<(String, String)> = deleted_by(page).into_iter().collect();
    let want: Vec<(String, String)> = [
        ("ClusterRole", "m"),
        ("ClusterRole", "x"),
        ("ClusterRole", "y"),
        ("ClusterRoleBinding", "m"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    assert_eq!(got, want);
}
