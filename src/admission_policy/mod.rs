//! The two rules as admission policies that run inside the API server (DESIGN §2.1), so that
//! they keep holding while no handoff replica runs. Everything here is pure: from the config
//! and the identities handoff can compute to the API objects; `apply` puts them in a cluster.
//!
//! - The guard is a ValidatingAdmissionPolicy whose parameter is a ConfigMap in which handoff
//!   publishes what CEL cannot compute (a kcp syncer's key is a SHA-224 of its sync target). A
//!   ConfigMap, not a CRD of handoff's own: a binding whose `paramKind` names a resource the API
//!   server does not serve fails *every* request its rules match (checked on v1.36.2: with
//!   `failurePolicy: Fail` every DELETE in the cluster), and ConfigMaps are always served. A
//!   missing ConfigMap is `parameterNotFoundAction: Allow`: with `Deny` the API server refuses
//!   every matched request before it evaluates `matchConditions`.
//! - The pin is two MutatingAdmissionPolicies whose parameter is the MoveWindow: one for the
//!   Deployments a window's selector picks (bound per window with that `objectSelector`), one
//!   for `deployments/scale`, which carries no labels, bound per window and limited to the
//!   Deployments the window lists as pinned. Bindings exist only while a window is open
//!   (`handoff window open|close` manage them): a policy without a binding is never evaluated.

pub mod apply;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use crate::rules::identity::{Identities, Located, SyncTarget};
use crate::rules::move_window::{OwnDeployment, SAVED_REPLICAS_ANNOTATION};
use crate::rules::rollout::{Exemption, Mode, Rollout};

pub const GUARD_POLICY: &str = "handoff-sync-finalizer";
pub const PIN_POLICY: &str = "handoff-move-window-pin";
pub const PIN_SCALE_POLICY: &str = "handoff-move-window-pin-scale";
pub const LEASE_HOLD_POLICY: &str = "handoff-lease-hold";
/// Every object `handoff policy` and `handoff window` create carry it, so that `uninstall`
/// finds them all, window bindings included.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "handoff");
/// On window bindings: the MoveWindow they belong to.
pub const WINDOW_LABEL: &str = "handoff.dev/move-window";
pub const FIELD_MANAGER: &str = "handoff";

/// The ConfigMap in which handoff publishes sync-target identities for the guard's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamsRef {
    pub namespace: String,
    pub name: String,
}

impl Default for ParamsRef {
    fn default() -> Self {
        ParamsRef {
            namespace: "handoff-system".into(),
            name: "handoff-sync-targets".into(),
        }
    }
}

impl std::str::FromStr for ParamsRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (namespace, name) = crate::config::parse_namespaced_name(s)?;
        Ok(ParamsRef { namespace, name })
    }
}

impl std::fmt::Display for ParamsRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

// ---------------------------------------------------------------------------------------------
// The published identities.

/// Characters a username may carry besides `[-.a-zA-Z0-9]`, and how they are written in a
/// ConfigMap key (which allows only `[-._a-zA-Z0-9]`). `_` comes first: it is the escape.
const ESCAPES: [(char, &str); 11] = [
    ('_', "_5f"),
    (':', "_3a"),
    ('@', "_40"),
    ('/', "_2f"),
    ('#', "_23"),
    ('+', "_2b"),
    ('=', "_3d"),
    ('%', "_25"),
    ('~', "_7e"),
    ('!', "_21"),
    (' ', "_20"),
];

/// The ConfigMap key of a configured username: `u.` and the username with `ESCAPES` applied.
/// The policy computes the same with a chain of `replace` (`cel_username_key`).
pub fn username_key(username: &str) -> Result<String, String> {
    let mut key = String::from("u.");
    for c in username.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
            key.push(c);
        } else if let Some((_, e)) = ESCAPES.iter().find(|(x, _)| *x == c) {
            key.push_str(e);
        } else {
            return Err(format!(
                "username {username:?}: the character {c:?} cannot be published to the admission policy (allowed: letters, digits, - . {})",
                ESCAPES.map(|(c, _)| c).iter().collect::<String>()
            ));
        }
    }
    if key.len() > 253 {
        return Err(format!(
            "username {username:?} is too long to publish to the admission policy"
        ));
    }
    Ok(key)
}

fn cel_username_key() -> String {
    let mut e = String::from("'u.' + variables.user");
    for (c, esc) in ESCAPES {
        let _ = write!(e, ".replace({}, '{esc}')", cel_str(&c.to_string()));
    }
    e
}

/// The key of a kcp syncer ServiceAccount name (`kcp-syncer-<name>-<id>`), whatever namespace
/// it runs in: the webhook ties a syncer to its sync target by that name alone.
pub fn service_account_key(sa_name: &str) -> String {
    format!("s.{sa_name}")
}

/// What the guard's policy reads: for each configured username and each kcp syncer that a
/// namespace's locator names, `"<uid> <name> <cluster> <key>,<key>"` (`-` for what is not
/// known). Entries that cannot be written are left out and returned with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directory {
    pub data: BTreeMap<String, String>,
    /// Sync targets of namespace locators that cannot be published: their syncers stay
    /// unresolved in the policy, held wherever any sync finalizer blocks.
    pub skipped: Vec<String>,
    /// Config-file identities that cannot be published: the policy would never hold them, so
    /// `handoff policy install` refuses.
    pub unpublishable: Vec<String>,
}

fn token(s: Option<&str>) -> Option<&str> {
    match s {
        None | Some("") => Some("-"),
        Some(t) if t.chars().any(|c| c.is_whitespace() || c == ',') => None,
        Some(t) => Some(t),
    }
}

fn entry(uid: Option<&str>, target: &SyncTarget) -> Result<String, String> {
    let keys: Vec<&str> = target.keys.iter().map(|k| k.0.as_str()).collect();
    if keys.is_empty() || keys.iter().any(|k| token(Some(k)) != Some(k)) {
        return Err(format!(
            "{target}: a key is empty or holds a space or a comma"
        ));
    }
    let (Some(uid), Some(name), Some(cluster)) = (
        token(uid),
        token(target.name.as_deref()),
        token(target.cluster.as_deref()),
    ) else {
        return Err(format!(
            "{target}: its UID, name or cluster holds a space or a comma"
        ));
    };
    Ok(format!("{uid} {name} {cluster} {}", keys.join(",")))
}

/// The identities to publish: the config file's, and every sync target some namespace's
/// locator names now (`Identities::located_targets`, or located from a list of namespaces).
pub fn directory(ids: &Identities, located: &[(String, std::sync::Arc<Located>)]) -> Directory {
    let mut dir = Directory::default();
    for (user, target) in ids.explicit() {
        match username_key(user).and_then(|k| Ok((k, entry(None, target)?))) {
            Ok((k, v)) => {
                dir.data.insert(k, v);
            }
            Err(e) => dir.unpublishable.push(e),
        }
    }
    // In a fixed order, so that replicas with the same view publish the same content.
    let place = |l: &Located| match l {
        Located::Target { target, .. } => (target.cluster.clone(), target.name.clone()),
        Located::Unusable(_) => (None, None),
    };
    let mut located: Vec<_> = located.iter().collect();
    located.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| place(&a.1).cmp(&place(&b.1))));
    for (uid, l) in located {
        let Located::Target { id, target } = l.as_ref() else {
            continue;
        };
        let sa = format!(
            "kcp-syncer-{}-{id}",
            target.name.as_deref().unwrap_or_default()
        );
        let key = service_account_key(&sa);
        if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            || key.len() > 253
        {
            dir.skipped.push(format!(
                "{target}: its syncer name {sa:?} cannot be a ConfigMap key"
            ));
            continue;
        }
        match entry(Some(uid), target) {
            Ok(v) => {
                // Two locators naming the same syncer (same name and UID hash) with different
                // clusters: keep both key sets, so that either hold counts.
                let v = match dir.data.get(&key) {
                    Some(old) if old != &v => {
                        let mut parts: Vec<String> = old.split(' ').map(str::to_string).collect();
                        let new_keys = v.rsplit(' ').next().unwrap_or_default();
                        for k in new_keys.split(',') {
                            if !parts[3].split(',').any(|o| o == k) {
                                parts[3].push(',');
                                parts[3].push_str(k);
                            }
                        }
                        parts.join(" ")
                    }
                    _ => v,
                };
                dir.data.insert(key, v);
            }
            Err(e) => dir.skipped.push(e),
        }
    }
    dir
}

/// The parameter ConfigMap, as `handoff policy install` and `handoff serve` apply it.
pub fn params_object(params: &ParamsRef, data: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": params.name,
            "namespace": params.namespace,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
            "annotations": {
                "handoff.dev/what": "sync-target identities for the ValidatingAdmissionPolicy handoff-sync-finalizer: u.<escaped username> (config file) and s.<kcp syncer ServiceAccount name> (namespace locators) to \"<uid> <sync target> <logical cluster> <keys>\"; kept current by handoff serve"
            }
        },
        "data": data,
    })
}

// ---------------------------------------------------------------------------------------------
// CEL helpers.

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

fn cel_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| cel_str(s)).collect();
    format!("[{}]", quoted.join(", "))
}

fn var(name: &str, expression: String) -> Value {
    json!({"name": name, "expression": expression})
}

fn labels() -> Value {
    json!({MANAGED_BY.0: MANAGED_BY.1})
}

/// The exemptions as match conditions: an exempt requester is never evaluated.
fn exemption_conditions(rollout: &Rollout) -> Vec<Value> {
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

// ---------------------------------------------------------------------------------------------
// The guard.

/// The guard's ValidatingAdmissionPolicy: the rule of DESIGN §1.1 in CEL, reading the
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

/// Never in the path of the control plane or of handoff itself, as the webhooks' own
/// `namespaceSelector` (for a Namespace, this selects on the Namespace itself).
fn namespace_selector() -> Value {
    json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "handoff-system"]}]})
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

// ---------------------------------------------------------------------------------------------
// The pin.

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
fn cel_params_selector(sel: &str, labels: &str) -> String {
    format!(
        "((!has({sel}.matchLabels) || {sel}.matchLabels.all(k, k in {labels} && {labels}[k] == {sel}.matchLabels[k])) && (!has({sel}.matchExpressions) || {sel}.matchExpressions.all(e, e.operator == 'In' ? (e.key in {labels} && {labels}[e.key] in e.?values.orValue([])) : e.operator == 'NotIn' ? !(e.key in {labels} && {labels}[e.key] in e.?values.orValue([])) : e.operator == 'Exists' ? e.key in {labels} : e.operator == 'DoesNotExist' ? !(e.key in {labels}) : false)))"
    )
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

// ---------------------------------------------------------------------------------------------
// The held-Lease guard.

/// The held-Lease guard (`policy::lease_hold`) in CEL: everything it reads is on the stored
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
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-node-lease", "handoff-system"]}]},
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

/// `handoff-pin-<window>[-scale]`: a MoveWindow's name is a DNS subdomain, and so is this
/// (the suffix fits: window names this long are refused by `window open`).
pub fn binding_name(window: &str, scale: bool) -> String {
    if scale {
        format!("handoff-pin-{window}-scale")
    } else {
        format!("handoff-pin-{window}")
    }
}

#[cfg(test)]
mod tests;
