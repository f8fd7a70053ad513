//! CEL helpers the policies share: literals, label selectors, exemptions, and what every
//! policy object carries.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use super::MANAGED_BY;
use crate::rules::rollout::{Exemption, Mode, Rollout};

/// A CEL string literal.
pub fn cel_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

pub(super) fn cel_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| cel_str(s)).collect();
    format!("[{}]", quoted.join(", "))
}

pub(super) fn var(name: &str, expression: String) -> Value {
    json!({"name": name, "expression": expression})
}

pub(super) fn labels() -> Value {
    json!({MANAGED_BY.0: MANAGED_BY.1})
}

/// The exemptions as match conditions: an exempt requester is never evaluated.
pub(super) fn exemption_conditions(rollout: &Rollout) -> Vec<Value> {
    let (mut users, mut groups) = (Vec::new(), Vec::new());
    for e in &rollout.exemptions {
        match e {
            Exemption::Username(u) => users.push(u.clone()),
            Exemption::Group(g) => groups.push(g.clone()),
        }
    }
    let mut out = Vec::new();
    if !users.is_empty() {
        out.push(json!({
            "name": "not-exempt-user",
            "expression": format!("!(request.userInfo.username in {})", cel_list(&users)),
        }));
    }
    if !groups.is_empty() {
        out.push(json!({
            "name": "not-exempt-group",
            "expression": format!(
                "!has(request.userInfo.groups) || !request.userInfo.groups.exists(g, g in {})",
                cel_list(&groups)
            ),
        }));
    }
    out
}

/// How an enforcement mode reaches the API server: the binding's `validationActions`.
pub fn validation_actions(mode: Mode) -> Value {
    match mode {
        Mode::Enforce => json!(["Deny"]),
        Mode::Warn => json!(["Warn"]),
        Mode::Audit => json!(["Audit"]),
    }
}

/// Never in the path of the control plane or of handoff itself, as the webhooks' own
/// `namespaceSelector` (for a Namespace, this selects on the Namespace itself).
pub(super) fn namespace_selector() -> Value {
    json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", crate::rules::move_window::HANDOFF_NAMESPACE]}]})
}

/// A label selector as CEL over `labels` (a map): Kubernetes' semantics (`NotIn` and
/// `DoesNotExist` hold where the key is absent).
pub fn cel_selector(sel: &LabelSelector, labels: &str) -> String {
    let mut terms: Vec<String> = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        terms.push(format!(
            "({k} in {labels} && {labels}[{k}] == {v})",
            k = cel_str(k),
            v = cel_str(v)
        ));
    }
    for e in sel.match_expressions.iter().flatten() {
        let k = cel_str(&e.key);
        let vals = cel_list(e.values.as_deref().unwrap_or_default());
        terms.push(match e.operator.as_str() {
            "In" => format!("({k} in {labels} && {labels}[{k}] in {vals})"),
            "NotIn" => format!("!({k} in {labels} && {labels}[{k}] in {vals})"),
            "Exists" => format!("({k} in {labels})"),
            "DoesNotExist" => format!("!({k} in {labels})"),
            _ => "false".to_string(),
        });
    }
    if terms.is_empty() {
        "true".into()
    } else {
        format!("({})", terms.join(" && "))
    }
}

/// The same, for a selector read from the parameter at admission time.
pub(super) fn cel_params_selector(sel: &str, labels: &str) -> String {
    format!(
        "((!has({sel}.matchLabels) || {sel}.matchLabels.all(k, k in {labels} && {labels}[k] == {sel}.matchLabels[k])) && (!has({sel}.matchExpressions) || {sel}.matchExpressions.all(e, e.operator == 'In' ? (e.key in {labels} && {labels}[e.key] in e.?values.orValue([])) : e.operator == 'NotIn' ? !(e.key in {labels} && {labels}[e.key] in e.?values.orValue([])) : e.operator == 'Exists' ? e.key in {labels} : e.operator == 'DoesNotExist' ? !(e.key in {labels}) : false)))"
    )
}
