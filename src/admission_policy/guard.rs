//! The sync-finalizer guard (docs/ARCHITECTURE.md §1.1) as a ValidatingAdmissionPolicy and its binding.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::cel::{
    cel_list, cel_str, exemption_conditions, labels, namespace_selector, validation_actions, var,
};
use super::directory::cel_username_key;
use super::{GUARD_POLICY, ParamsRef};
use crate::rules::identity::Identities;
use crate::rules::rollout::{Mode, Rollout};

/// The guard's ValidatingAdmissionPolicy: the rule of docs/ARCHITECTURE.md §1.1 in CEL, reading the
/// namespace's annotations (`namespaceObject`), the object's (`oldObject`; a delete-collection
/// reaches admission once per item) and the published identities (`params`).
pub fn guard_policy(ids: &Identities, rollout: &Rollout) -> Value {
    // Usernames the `kcp-syncer-` test below does not catch, as the webhook's matchCondition
    // needs them added (config::usernames_the_webhook_never_sees).
    let explicit_users = ids.explicit().next().is_some();
    let mut extra: Vec<String> = ids
        .explicit()
        .map(|(u, _)| u.to_string())
        .filter(|u| !crate::config::match_condition_sends(u))
        .collect();
    extra.sort();
    let mut candidates = String::from(
        "(request.userInfo.username.startsWith('system:serviceaccount:') && size(request.userInfo.username.split(':')) == 4 && request.userInfo.username.split(':')[3].startsWith('kcp-syncer-'))",
    );
    if !extra.is_empty() {
        let _ = write!(
            candidates,
            " || request.userInfo.username in {}",
            cel_list(&extra)
        );
    }
    let mut conditions = vec![json!({"name": "sync-target-candidates", "expression": candidates})];
    conditions.extend(exemption_conditions(rollout));

    let prefixes: Vec<String> = ids.finalizer_prefixes().to_vec();
    let locator = ids
        .locator_keys()
        .iter()
        .rev()
        .fold("''".to_string(), |acc, k| {
            format!("variables.nsAnn[?{}].orValue({acc})", cel_str(k))
        });
    let holds = |ann: &str| {
        format!(
            "{ann}.filter(a, {ann}[a] != '' && variables.prefixes.exists(p, a.startsWith(p) && variables.keys.exists(k, a == p + k)))"
        )
    };
    let any = |ann: &str| {
        format!(
            "{ann}.filter(a, {ann}[a] != '' && variables.prefixes.exists(p, a.startsWith(p) && size(a) > size(p)))"
        )
    };
    let unresolved = format!(
        "variables.user + ' looks like a kcp syncer but the admission policy cannot tell which sync target it serves: ' + (variables.conv == '' ? 'handoff has published no sync target for ServiceAccount ' + variables.saName + ' (' + {hint} + ')' : 'the namespace locator does not name the sync target handoff published for it') + '. Because ' + (size(variables.nsAny) > 0 ? 'namespace \"' + request.namespace + '\"' : variables.what) + ' carries the sync finalizer ' + (size(variables.nsAny) > 0 ? variables.nsAny[0] + '=\"' + variables.nsAnn[variables.nsAny[0]] : variables.objAny[0] + '=\"' + variables.objAnn[variables.objAny[0]]) + '\", the delete of ' + variables.what + ' is refused: it could be the sync target being held. Fix the namespace locator, or name this user in handoff\\'s config file'",
        hint = cel_str(PARAMS_HINT)
    );
    let variables = vec![
        var("user", "request.userInfo.username".into()),
        var("parts", "variables.user.split(':')".into()),
        var(
            "saName",
            "size(variables.parts) == 4 && variables.parts[2] != '' && variables.parts[3].matches('^kcp-syncer-.+-[0-9a-z]{8}$') ? variables.parts[3] : ''".into(),
        ),
        var("data", "params.?data.orValue({})".into()),
        // Each CEL step costs the API server time on every syncer's delete: without explicit
        // identities in the config file there is no `u.` entry to look up. (`handoff serve`
        // publishes from the same config file as `install` renders from.)
        var(
            "explicit",
            if explicit_users {
                format!("variables.data[?({})].orValue('')", cel_username_key())
            } else {
                "''".into()
            },
        ),
        var(
            "conv",
            "variables.saName == '' ? '' : variables.data[?('s.' + variables.saName)].orValue('')".into(),
        ),
        var(
            "isNamespace",
            "request.resource.group == '' && request.resource.resource == 'namespaces' && !has(request.subResource)".into(),
        ),
        // For a Namespace the API server gives no namespaceObject: the object is its own
        // namespace, as in the webhook (rule 3).
        var(
            "nsAnn",
            "variables.isNamespace ? oldObject.?metadata.?annotations.orValue({}) : namespaceObject.?metadata.?annotations.orValue({})".into(),
        ),
        var("objAnn", "oldObject.?metadata.?annotations.orValue({})".into()),
        var("locator", locator),
        var(
            "st",
            format!("variables.locator.find({})", cel_str(r#""syncTarget":\{[^{}]*\}"#)),
        ),
        var(
            "c",
            "variables.conv == '' ? [] : variables.conv.split(' ')".into(),
        ),
        // A syncer is tied to its sync target only when the namespace's locator names the
        // UID and name it was published with (kcp writes the locator as compact JSON).
        var(
            "fields",
            // The locator's syncTarget object must name the UID, name and logical cluster
            // the entry was published with (its own cluster, else the locator's): what the
            // webhook's `locate` reads from the parsed JSON.
            format!(
                "variables.explicit != '' ? variables.explicit.split(' ') : (size(variables.c) == 4 && {st}.contains('\"uid\":\"' + variables.c[0] + '\"') && {st}.contains('\"name\":\"' + variables.c[1] + '\"') && ({st}.contains('\"cluster\":\"' + variables.c[2] + '\"') || {st}.contains('\"workspace\":\"' + variables.c[2] + '\"') || {st}.contains('\"path\":\"' + variables.c[2] + '\"') || (!{st}.matches({named}) && (variables.locator.contains('\"cluster\":\"' + variables.c[2] + '\"') || variables.locator.contains('\"workspace\":\"' + variables.c[2] + '\"')))) ? variables.c : [])",
                st = "variables.st",
                named = cel_str(r#""(cluster|workspace|path)":"[^"]+""#),
            ),
        ),
        var("resolved", "size(variables.fields) == 4".into()),
        var(
            "keys",
            "variables.resolved ? variables.fields[3].split(',') : []".into(),
        ),
        var("prefixes", cel_list(&prefixes)),
        // The verdict looks up the few annotations that could hold this sync target instead
        // of scanning every annotation; the lists below are built only for a denial's message.
        var(
            "held",
            "variables.keys.exists(k, variables.prefixes.exists(p, variables.nsAnn[?(p + k)].orValue('') != '' || variables.objAnn[?(p + k)].orValue('') != ''))".into(),
        ),
        var(
            "anyHeld",
            "variables.nsAnn.exists(a, variables.nsAnn[a] != '' && variables.prefixes.exists(p, a.startsWith(p) && size(a) > size(p))) || variables.objAnn.exists(a, variables.objAnn[a] != '' && variables.prefixes.exists(p, a.startsWith(p) && size(a) > size(p)))".into(),
        ),
        var(
            "denied",
            "variables.resolved ? variables.held : variables.saName != '' && variables.anyHeld".into(),
        ),
        var("nsHolds", holds("variables.nsAnn")),
        var("objHolds", holds("variables.objAnn")),
        var("nsAny", any("variables.nsAnn")),
        var("objAny", any("variables.objAnn")),
        var(
            "objName",
            "has(request.name) && request.name != '' ? request.name : oldObject.?metadata.?name.orValue('')".into(),
        ),
        var(
            "what",
            "request.resource.resource + (request.resource.group != '' ? '.' + request.resource.group : '') + (has(request.subResource) && request.subResource != '' ? '/' + request.subResource : '') + ' \"' + variables.objName + '\"' + (has(request.name) && request.name != '' ? '' : ' (delete-collection item)')".into(),
        ),
        var(
            "target",
            "!variables.resolved ? '' : variables.fields[1] != '-' ? 'sync target \"' + variables.fields[1] + '\"' + (variables.fields[2] != '-' ? ' (cluster ' + variables.fields[2] + ')' : '') : 'sync target with key ' + variables.keys[0]".into(),
        ),
        var(
            "denial",
            format!(
                "!variables.resolved ? (variables.saName != '' && size(variables.nsAny) + size(variables.objAny) > 0 ? {unresolved} : '') : variables.isNamespace ? (size(variables.objHolds) + size(variables.nsHolds) > 0 ? {itself} : '') : size(variables.nsHolds) > 0 ? {ns} : size(variables.objHolds) > 0 ? {obj} : ''",
                unresolved = unresolved,
                itself = ns_message("(size(variables.objHolds) > 0 ? variables.objHolds[0] : variables.nsHolds[0])", "(size(variables.objHolds) > 0 ? variables.objAnn[variables.objHolds[0]] : variables.nsAnn[variables.nsHolds[0]])", "deleting the namespace would delete everything in it"),
                ns = ns_message("variables.nsHolds[0]", "variables.nsAnn[variables.nsHolds[0]]", "its objects stay until the hold is lifted"),
                obj = "variables.what + ' carries the soft finalizer ' + variables.objHolds[0] + '=\"' + variables.objAnn[variables.objHolds[0]] + '\" for ' + variables.target + ', so that sync target may not delete it yet. The hold lifts when the finalizer\\'s owner removes the annotation or sets it to \"\"'",
            ),
        ),
    ];
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": GUARD_POLICY, "labels": labels()},
        "spec": {
            // Fail: an error evaluating the rule holds the delete (fail closed, like the
            // webhook). Only sync-target candidates get that far: the match conditions are
            // string tests on the username that cannot fail, and the parameter is a
            // ConfigMap, a kind every API server serves.
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "namespaceSelector": namespace_selector(),
                "resourceRules": [
                    {"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["*/*"], "scope": "Namespaced"},
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["namespaces"]}
                ]
            },
            "matchConditions": conditions,
            "variables": variables,
            "validations": [{
                "expression": "!variables.denied",
                "messageExpression": "variables.denial",
                "reason": "Forbidden",
            }],
        }
    })
}

const PARAMS_HINT: &str = "is handoff serve running with the namespaces watch, or was handoff policy install run after the namespace appeared?";

fn ns_message(annotation: &str, value: &str, consequence: &str) -> String {
    format!(
        "'namespace \"' + request.namespace + '\" carries the sync finalizer ' + {annotation} + '=\"' + {value} + '\" for ' + variables.target + ', so that sync target may not delete ' + variables.what + ' ({consequence}). The hold lifts when the annotation is removed or set to \"\": kubectl annotate namespace ' + request.namespace + ' ' + {annotation} + '-'"
    )
}

/// The guard's binding: the parameter ConfigMap, and the enforcement mode as
/// `validationActions`.
pub fn guard_binding(params: &ParamsRef, mode: Mode) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": GUARD_POLICY, "labels": labels()},
        "spec": {
            "policyName": GUARD_POLICY,
            "paramRef": {
                "name": params.name,
                "namespace": params.namespace,
                // Never Deny: a missing parameter would then refuse every DELETE in the
                // cluster, before the match conditions narrow it to sync targets.
                "parameterNotFoundAction": "Allow",
            },
            "validationActions": validation_actions(mode),
        }
    })
}
