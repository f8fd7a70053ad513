//! The held-Lease guard as a ValidatingAdmissionPolicy and its binding.

use serde_json::{Value, json};

use super::LEASE_HOLD_POLICY;
use super::cel::{cel_str, exemption_conditions, labels, validation_actions, var};
use crate::rules::rollout::{Mode, Rollout};

/// The held-Lease guard (`rules::lease_hold`) in CEL: everything it reads is on the stored
/// Lease, so it needs no parameter. Only Leases a window holds match (`objectSelector`; for
/// UPDATE the API server also matches the old object, for DELETE the object deleted).
pub fn lease_hold_policy(rollout: &Rollout) -> Value {
    use crate::rules::lease_hold::{HELD_BY_LABEL, OPERATOR_ANNOTATION};
    let held = cel_str(HELD_BY_LABEL);
    let op = cel_str(OPERATOR_ANNOTATION);
    let mut conditions = vec![json!({
        "name": "held-by-a-window",
        "expression": format!("oldObject != null && {held} in oldObject.metadata.?labels.orValue({{}})"),
    })];
    conditions.extend(exemption_conditions(rollout));
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": LEASE_HOLD_POLICY, "labels": labels()},
        "spec": {
            // Fail: only held Leases match, and the expressions cannot fail (every read is
            // guarded); Ignore would let a controller take its Lease back on a policy error.
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-node-lease", crate::rules::move_window::HANDOFF_NAMESPACE]}]},
                "objectSelector": {"matchExpressions": [{"key": HELD_BY_LABEL, "operator": "Exists"}]},
                "resourceRules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE", "DELETE"], "resources": ["leases"]}],
            },
            "matchConditions": conditions,
            "variables": [
                var("window", format!("oldObject.metadata.labels[{held}]")),
                var("operator", format!("oldObject.metadata.?annotations[?{op}].orValue('')")),
                var("verb", "request.operation == 'DELETE' ? 'delete' : 'change'".into()),
            ],
            "validations": [{
                "expression": "variables.operator != '' && request.userInfo.username == variables.operator",
                "messageExpression": "'Lease ' + request.namespace + '/' + request.name + ' is held by MoveWindow \"' + variables.window + '\", which keeps the controller that leader-elects with it stopped while its webhooks serve during a cluster move; ' + (variables.operator != '' ? 'only its operator \"' + variables.operator + '\" may ' + variables.verb + ' it' : 'the hold names no operator, so nobody may ' + variables.verb + ' it through handoff') + '. Release it with `handoff window close ' + variables.window + '` as ' + (variables.operator != '' ? variables.operator : 'the window operator')",
                "reason": "Forbidden",
            }],
        }
    })
}

pub fn lease_hold_binding(mode: Mode) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": LEASE_HOLD_POLICY, "labels": labels()},
        "spec": {
            "policyName": LEASE_HOLD_POLICY,
            "validationActions": validation_actions(mode),
        }
    })
}
