//! The policies one window puts in place itself where nothing of handoff guards a cluster (no
//! held-Lease webhook or policy, no pin): the same rules as `lease_hold` and `pin`, under names
//! of the window's own and scoped to it, so that two moves of different namespaces never share
//! (or remove) each other's. Owned by the window: deleting it takes them along.
//!
//! - The held-Lease guard matches only the Leases this window holds (its label's value is the
//!   window's name), and needs no parameter.
//! - The pin is the two MutatingAdmissionPolicies with the window as their parameter, bound to
//!   its selector and to the scale of the Deployments it pins.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use super::{
    MANAGED_BY, WINDOW_LABEL, lease_hold_binding, lease_hold_policy, pin_policy, pin_scale_policy,
    window_bindings,
};
use crate::rules::lease_hold::HELD_BY_LABEL;
use crate::rules::move_window::OwnDeployment;
use crate::rules::rollout::{Mode, Rollout};

/// `handoff-window-<window>-<what>`: a window's name is at most 63 characters.
fn name(window: &str, what: &str) -> String {
    format!("handoff-window-{window}-{what}")
}

/// Every object `lease_guard` and `pin` render, as (kind, name): what removing a window's
/// deletes, whether or not it was put in place.
pub fn names(window: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "ValidatingAdmissionPolicyBinding",
            name(window, "lease-hold"),
        ),
        ("ValidatingAdmissionPolicy", name(window, "lease-hold")),
        ("MutatingAdmissionPolicyBinding", name(window, "pin")),
        ("MutatingAdmissionPolicyBinding", name(window, "pin-scale")),
        ("MutatingAdmissionPolicy", name(window, "pin")),
        ("MutatingAdmissionPolicy", name(window, "pin-scale")),
    ]
}

fn own_meta(obj: &mut Value, window: &str, name: String, uid: Option<&str>) {
    let meta = &mut obj["metadata"];
    meta["name"] = json!(name);
    meta["labels"] = json!({MANAGED_BY.0: MANAGED_BY.1, WINDOW_LABEL: window});
    meta["ownerReferences"] = json!(
        uid.map(|uid| vec![json!({"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow", "name": window, "uid": uid})])
            .unwrap_or_default()
    );
}

/// The held-Lease guard for the Leases `window` holds: the policy and its binding.
pub fn lease_guard(window: &str, uid: Option<&str>) -> [Value; 2] {
    let n = name(window, "lease-hold");
    let mut policy = lease_hold_policy(&Rollout::default());
    own_meta(&mut policy, window, n.clone(), uid);
    policy["spec"]["matchConstraints"]["objectSelector"] =
        json!({"matchLabels": {HELD_BY_LABEL: window}});
    let mut binding = lease_hold_binding(Mode::Enforce);
    own_meta(&mut binding, window, n.clone(), uid);
    binding["spec"]["policyName"] = json!(n);
    [policy, binding]
}

/// The pin for `window`: both policies and both bindings.
pub fn pin(window: &str, uid: Option<&str>, selector: &LabelSelector) -> [Value; 4] {
    let rollout = Rollout::default();
    let own = OwnDeployment::default();
    let (p, s) = (name(window, "pin"), name(window, "pin-scale"));
    let mut policy = pin_policy(&own, &rollout);
    own_meta(&mut policy, window, p.clone(), uid);
    let mut scale = pin_scale_policy(&own, &rollout);
    own_meta(&mut scale, window, s.clone(), uid);
    let [mut b, mut bs] = window_bindings(window, uid, selector);
    own_meta(&mut b, window, p.clone(), uid);
    b["spec"]["policyName"] = json!(p);
    own_meta(&mut bs, window, s.clone(), uid);
    bs["spec"]["policyName"] = json!(s);
    [policy, scale, b, bs]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission_policy::{LEASE_HOLD_POLICY, PIN_POLICY, PIN_SCALE_POLICY};

    #[test]
    fn the_lease_guard_matches_only_this_windows_leases() {
        let [p, b] = lease_guard("move-a", Some("u"));
        assert_eq!(p["metadata"]["name"], "handoff-window-move-a-lease-hold");
        assert_eq!(p["metadata"]["labels"][WINDOW_LABEL], "move-a");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "u");
        assert_eq!(
            p["spec"]["matchConstraints"]["objectSelector"],
            json!({"matchLabels": {HELD_BY_LABEL: "move-a"}})
        );
        // The installed policy's rule, unchanged.
        let installed = lease_hold_policy(&Rollout::default());
        assert_eq!(p["spec"]["validations"], installed["spec"]["validations"]);
        assert_eq!(p["spec"]["failurePolicy"], "Fail");
        assert_eq!(b["spec"]["policyName"], "handoff-window-move-a-lease-hold");
        assert_ne!(b["spec"]["policyName"], LEASE_HOLD_POLICY);
        assert_eq!(b["spec"]["validationActions"], json!(["Deny"]));
    }

    #[test]
    fn the_pin_is_bound_to_this_window_only() {
        let sel = crate::resources::move_window::default_deployment_selector();
        let [p, s, b, bs] = pin("move-a", None, &sel);
        assert_eq!(p["metadata"]["name"], "handoff-window-move-a-pin");
        assert_eq!(s["metadata"]["name"], "handoff-window-move-a-pin-scale");
        assert_eq!(b["spec"]["policyName"], "handoff-window-move-a-pin");
        assert_eq!(bs["spec"]["policyName"], "handoff-window-move-a-pin-scale");
        assert_ne!(b["spec"]["policyName"], PIN_POLICY);
        assert_ne!(bs["spec"]["policyName"], PIN_SCALE_POLICY);
        assert_eq!(b["spec"]["paramRef"]["name"], "move-a");
        assert_eq!(
            b["spec"]["matchResources"]["objectSelector"],
            serde_json::to_value(&sel).unwrap()
        );
        assert_eq!(b["metadata"]["labels"][WINDOW_LABEL], "move-a");
        // Every object it renders is one `names` removes.
        let all = names("move-a");
        for o in lease_guard("move-a", None).iter().chain([&p, &s, &b, &bs]) {
            let key = (
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            );
            assert!(all.contains(&key), "{key:?}");
        }
    }
}
