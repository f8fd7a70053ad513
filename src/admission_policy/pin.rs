//! The move window's pin as two MutatingAdmissionPolicies (Deployments, and their scale
//! subresource) and the per-window bindings that put them in force.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use super::cel::{
    cel_params_selector, cel_selector, cel_str, exemption_conditions, labels, namespace_selector,
    var,
};
use super::{MANAGED_BY, PIN_POLICY, PIN_SCALE_POLICY, WINDOW_LABEL};
use crate::rules::move_window::{OwnDeployment, SAVED_REPLICAS_ANNOTATION};
use crate::rules::rollout::{Mode, Rollout};

fn own_condition(own: &OwnDeployment) -> Value {
    json!({
        "name": "not-handoff-itself",
        "expression": format!(
            "!(request.namespace == {} && request.name == {})",
            cel_str(&own.namespace),
            cel_str(&own.name)
        ),
    })
}

fn window_open_condition() -> Value {
    json!({"name": "window-open", "expression": "params.?spec.?state.orValue('') == 'Open'"})
}

/// A count the webhook can read back (`SavedReplicas::parse`): a non-negative i32.
fn cel_readable(s: &str) -> String {
    // Rust's i32 parse takes a sign and any number of leading zeros; CEL's `int` must not
    // overflow (an error would skip the pin), hence at most ten significant digits.
    format!(
        "({s}.trim().matches('^[+-]?0*[0-9]{{1,10}}$') && int({s}.trim()) >= 0 && int({s}.trim()) <= 2147483647)"
    )
}

/// The pin for Deployments: `replicas: 0` and the count asked for in
/// `handoff.dev/replicas-before-move`, exactly as the webhook patches (`pin_deployment`).
pub fn pin_policy(own: &OwnDeployment, rollout: &Rollout) -> Value {
    let key = SAVED_REPLICAS_ANNOTATION;
    let mut conditions = vec![own_condition(own), window_open_condition()];
    // A binding's objectSelector matches when the old *or* the new object matches; the webhook
    // pins only what the window selects now, so an update that takes a Deployment out of the
    // selector passes unpinned.
    // A Lease-stopped controller keeps its replicas (they serve its webhooks).
    conditions.push(json!({
        "name": "not-lease-stopped",
        "expression": "!params.?status.?pinned.orValue([]).exists(p, p.namespace == request.namespace && p.name == request.name && p.?strategy.orValue('Scale') == 'Lease' && !has(p.restoredAt))",
    }));
    conditions.push(json!({
        "name": "selected-by-window",
        "expression": format!(
            "has(params.spec.deploymentSelector) ? {} : {}",
            cel_params_selector("params.spec.deploymentSelector", "object.metadata.?labels.orValue({})"),
            cel_selector(&crate::resources::move_window::default_deployment_selector(), "object.metadata.?labels.orValue({})"),
        ),
    }));
    conditions.extend(exemption_conditions(rollout));
    let variables = vec![
        var(
            "asked",
            "has(object.spec.replicas) ? object.spec.replicas : 1".into(),
        ),
        var(
            "present",
            format!("object.metadata.?annotations[?{}]", cel_str(key)),
        ),
        var(
            "old",
            format!(
                "oldObject == null ? '' : oldObject.metadata.?annotations[?{}].orValue('')",
                cel_str(key)
            ),
        ),
        // '' = leave an unreadable annotation for `handoff window close` to report.
        var(
            "saved",
            format!(
                "variables.asked != 0 ? string(variables.asked) : variables.present.hasValue() && {pr} ? string(int(variables.present.value().trim())) : {old} ? string(int(variables.old.trim())) : variables.present.hasValue() ? '' : '0'",
                pr = cel_readable("variables.present.value()"),
                old = cel_readable("variables.old"),
            ),
        ),
    ];
    let patch = format!(
        "variables.asked < 0 ? [] : ((!has(object.spec.replicas) || object.spec.replicas != 0) ? [JSONPatch{{op: 'add', path: '/spec/replicas', value: 0}}] : []) + (variables.saved == '' ? [] : !has(object.metadata.annotations) ? [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{{k}: variables.saved}}}}] : variables.present.orValue('') != variables.saved ? [JSONPatch{{op: 'add', path: '/metadata/annotations/' + jsonpatch.escapeKey({k}), value: variables.saved}}] : [])",
        k = cel_str(key)
    );
    mutating_policy(
        PIN_POLICY,
        // Ignore, unlike the webhook's Deployment entry: the API server raises a policy's
        // configuration errors (its parameter kind gone with the CRD) before it reads a
        // binding's objectSelector, so Fail could refuse every Deployment write in the cluster.
        // The CEL itself does not fail; the webhook, where it runs, still fails closed.
        "Ignore",
        json!([{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]),
        conditions,
        variables,
        patch,
        rollout.move_window,
    )
}

/// The pin for `deployments/scale` of the Deployments a window lists as pinned.
pub fn pin_scale_policy(own: &OwnDeployment, rollout: &Rollout) -> Value {
    let mut conditions = vec![own_condition(own), window_open_condition()];
    conditions.push(json!({
        "name": "pinned-by-window",
        "expression": "params.?status.?pinned.orValue([]).exists(p, p.namespace == request.namespace && p.name == request.name && !has(p.restoredAt) && p.?strategy.orValue('Scale') != 'Lease')",
    }));
    conditions.extend(exemption_conditions(rollout));
    mutating_policy(
        PIN_SCALE_POLICY,
        // Ignore, as the webhook's scale entry: it is bound to every scale request in the
        // cluster, and an application's scale-up is never refused.
        "Ignore",
        json!([{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["deployments/scale"]}]),
        conditions,
        vec![var(
            "asked",
            "has(object.spec.replicas) ? object.spec.replicas : 0".into(),
        )],
        "variables.asked > 0 ? [JSONPatch{op: 'add', path: '/spec/replicas', value: 0}] : []"
            .into(),
        rollout.move_window,
    )
}

fn mutating_policy(
    name: &str,
    failure: &str,
    rules: Value,
    mut conditions: Vec<Value>,
    variables: Vec<Value>,
    patch: String,
    mode: Mode,
) -> Value {
    // A MutatingAdmissionPolicy cannot warn or audit instead of mutating: under `warn` or
    // `audit` it is installed but never matches, and the webhook alone warns or records.
    if mode != Mode::Enforce {
        conditions.insert(
            0,
            json!({"name": format!("enforcement-{}", mode_name(mode)), "expression": "false"}),
        );
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels()},
        "spec": {
            "failurePolicy": failure,
            "paramKind": {"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow"},
            "matchConstraints": {"namespaceSelector": namespace_selector(), "resourceRules": rules},
            "matchConditions": conditions,
            "variables": variables,
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
            "reinvocationPolicy": "IfNeeded",
        }
    })
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Enforce => "enforce",
        Mode::Warn => "warn",
        Mode::Audit => "audit",
    }
}

/// The bindings that make an open MoveWindow pin through the policies: its Deployments by its
/// selector, and scale requests for the Deployments it lists as pinned.
pub fn window_bindings(window: &str, uid: Option<&str>, selector: &LabelSelector) -> [Value; 2] {
    // Owned by the window: deleting it (or its CRD) without `window close` takes them along.
    let owners: Vec<Value> = uid
        .map(|uid| json!({"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow", "name": window, "uid": uid}))
        .into_iter()
        .collect();
    let meta = |name: String| json!({"name": name, "labels": {MANAGED_BY.0: MANAGED_BY.1, WINDOW_LABEL: window}, "ownerReferences": owners});
    let param = json!({"name": window, "parameterNotFoundAction": "Allow"});
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": meta(binding_name(window, false)),
            "spec": {
                "policyName": PIN_POLICY,
                "paramRef": param,
                "matchResources": {
                    "objectSelector": selector,
                    "resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}],
                },
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": meta(binding_name(window, true)),
            "spec": {
                "policyName": PIN_SCALE_POLICY,
                "paramRef": param,
                "matchResources": {
                    "resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["deployments/scale"]}],
                },
            }
        }),
    ]
}

/// `handoff-pin-<window>[-scale]`: a MoveWindow's name is a DNS subdomain, and so is this
/// (the suffix fits: window names this long are refused by `window open`).
pub fn binding_name(window: &str, scale: bool) -> String {
    if scale {
        format!("handoff-pin-{window}-scale")
    } else {
        format!("handoff-pin-{window}")
    }
}
