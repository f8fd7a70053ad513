//! A window's own webhook configuration: while it is open, the writes its pin depends on go to
//! handoff through entries that fail closed and that nobody else's request reaches; outside a
//! window, nothing of handoff fails closed for a Deployment (the installed `handoff`
//! configuration's entries are `Ignore`).
//!
//! - Deployments the window selects (its `deploymentSelector` as the `objectSelector`): a
//!   create or update that slips past the pin would bring a controller back mid-move.
//! - The scale subresource of exactly the Deployments it pins (`matchConditions` on namespace
//!   and name): a Scale carries no labels, so the installed scale entry sees every Deployment's
//!   scale in the cluster (every HPA) and must fail open; this one is scoped so that it can
//!   fail closed.
//!
//! `window open` writes it before it stops anything, `window close` deletes it right after the
//! window is marked Closed (the restores must pass while handoff is down), and the window owns
//! it, so that deleting the window (or its CRD) takes it along. Its `clientConfig` is the
//! installed configuration's (service or URL, and the caBundle), so it reaches the same
//! servers; where no handoff configuration is installed, there is nothing to copy and no
//! window configuration is written. Held Leases need no entry here: the installed
//! `lease-hold.handoff.dev` is scoped to them by their label already.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use crate::admission_policy::{MANAGED_BY, WINDOW_LABEL, apply};

/// The installed MutatingWebhookConfiguration whose entries a window's copies.
pub const INSTALLED: &str = "handoff";
const KIND: &str = "MutatingWebhookConfiguration";
/// cert-manager's cainjector keeps the caBundle of every configuration annotated so.
const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";

/// `handoff-window-<window>`: a MoveWindow's name is at most 63 characters (`window open`
/// refuses longer ones), so this fits a configuration's name.
pub fn name(window: &str) -> String {
    format!("handoff-window-{window}")
}

/// The window's configuration, from the installed one (`installed`, as read); `None` where
/// the installed one has no move-window entry to copy.
pub fn configuration(
    installed: &Value,
    window: &str,
    uid: Option<&str>,
    selector: &LabelSelector,
    pinned: &[(String, String)],
) -> Option<Value> {
    let entries = installed["webhooks"].as_array()?;
    let model = ["move-window.handoff.dev", "move-window-scale.handoff.dev"]
        .iter()
        .find_map(|n| entries.iter().find(|w| w["name"] == *n))?;
    let common = |name: &str, rules: Value| {
        let mut w = json!({
            "name": name,
            "clientConfig": model["clientConfig"],
            "rules": rules,
            // The point of this configuration: what the window stops cannot be changed past
            // the pin while handoff is down, and nothing else reaches it.
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "reinvocationPolicy": "IfNeeded",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": model.get("timeoutSeconds").cloned().unwrap_or(json!(5)),
        });
        if let Some(ns) = model.get("namespaceSelector") {
            w["namespaceSelector"] = ns.clone();
        }
        w
    };
    let mut deployments = common(
        "move-window.handoff.dev",
        json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "scope": "Namespaced"}]),
    );
    deployments["objectSelector"] = serde_json::to_value(selector).unwrap_or(json!({}));
    let mut webhooks = vec![deployments];
    if !pinned.is_empty() {
        let mut scale = common(
            "move-window-scale.handoff.dev",
            json!([{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments/scale"], "scope": "Namespaced"}]),
        );
        scale["matchConditions"] = json!([
            {"name": "pinned-by-window", "expression": pinned_condition(pinned)},
            // As the installed entry: a scale to 0 arrives without spec.replicas.
            {"name": "scales-up-only", "expression": "has(object.spec) && has(object.spec.replicas) && object.spec.replicas > 0"},
        ]);
        webhooks.push(scale);
    }
    let mut annotations = serde_json::Map::new();
    if let Some(from) = installed["metadata"]["annotations"][INJECT_CA_FROM].as_str() {
        annotations.insert(INJECT_CA_FROM.into(), json!(from));
    }
    let owners: Vec<Value> = uid
        .map(|uid| json!({"apiVersion": "handoff.dev/v1alpha1", "kind": "MoveWindow", "name": window, "uid": uid}))
        .into_iter()
        .collect();
    Some(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": KIND,
        "metadata": {
            "name": name(window),
            "labels": {MANAGED_BY.0: MANAGED_BY.1, WINDOW_LABEL: window},
            "annotations": annotations,
            "ownerReferences": owners,
        },
        "webhooks": webhooks,
    }))
}

/// `request.namespace + '/' + request.name in [...]`, every key a CEL string literal.
fn pinned_condition(pinned: &[(String, String)]) -> String {
    let keys: Vec<String> = pinned
        .iter()
        .map(|(ns, name)| crate::admission_policy::cel_str(&format!("{ns}/{name}")))
        .collect();
    format!(
        "request.namespace + '/' + request.name in [{}]",
        keys.join(", ")
    )
}

/// Write the window's configuration where handoff's is installed; `true` when written.
pub async fn put(
    client: &kube::Client,
    window: &str,
    uid: Option<&str>,
    selector: &LabelSelector,
    pinned: &[(String, String)],
) -> Result<bool, kube::Error> {
    let Some(found) = apply::get(client, KIND, INSTALLED).await? else {
        return Ok(false);
    };
    let Some(c) = configuration(&found, window, uid, selector, pinned) else {
        return Ok(false);
    };
    apply::apply(client, &c).await?;
    Ok(true)
}

/// Delete the window's configuration; `true` when it was there.
pub async fn remove(client: &kube::Client, window: &str) -> Result<bool, kube::Error> {
    apply::delete(
        client,
        &json!({"kind": KIND, "metadata": {"name": name(window)}}),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn installed() -> Value {
        serde_json::from_str(
            r#"{"metadata": {"name": "handoff", "annotations": {"cert-manager.io/inject-ca-from": "handoff-system/handoff-serving"}},
                "webhooks": [
                  {"name": "move-window.handoff.dev", "clientConfig": {"service": {"namespace": "handoff-system", "name": "handoff-pin", "path": "/mutate/move-window", "port": 443}, "caBundle": "Q0E="},
                   "failurePolicy": "Ignore", "timeoutSeconds": 7,
                   "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "handoff-system"]}]},
                   "objectSelector": {"matchExpressions": [{"key": "cluster.x-k8s.io/provider", "operator": "Exists"}]}},
                  {"name": "move-window-scale.handoff.dev", "clientConfig": {"url": "https://elsewhere/"}, "failurePolicy": "Ignore"}]}"#,
        )
        .unwrap()
    }

    fn selector() -> LabelSelector {
        crate::resources::move_window::default_deployment_selector()
    }

    #[test]
    fn fails_closed_only_for_what_the_window_stops() {
        let pinned = vec![(
            "capd-system".to_string(),
            "capd-controller-manager".to_string(),
        )];
        let c = configuration(&installed(), "move-ns1", Some("u-1"), &selector(), &pinned).unwrap();
        assert_eq!(c["metadata"]["name"], "handoff-window-move-ns1");
        assert_eq!(c["metadata"]["labels"][WINDOW_LABEL], "move-ns1");
        assert_eq!(c["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(
            c["metadata"]["annotations"][INJECT_CA_FROM],
            "handoff-system/handoff-serving"
        );
        let hooks = c["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 2);
        for h in hooks {
            assert_eq!(h["failurePolicy"], "Fail", "{h}");
            // The installed Deployment entry's: the same servers, the same exemptions.
            assert_eq!(h["clientConfig"]["service"]["name"], "handoff-pin");
            assert_eq!(h["clientConfig"]["caBundle"], "Q0E=");
            assert_eq!(h["timeoutSeconds"], 7);
            assert_eq!(
                h["namespaceSelector"]["matchExpressions"][0]["values"][1],
                "handoff-system"
            );
        }
        // Deployments: exactly the window's selector.
        assert_eq!(
            hooks[0]["objectSelector"],
            serde_json::to_value(selector()).unwrap()
        );
        assert_eq!(hooks[0]["rules"][0]["resources"], json!(["deployments"]));
        // Scale: exactly the pinned Deployments, and never a scale to 0.
        assert_eq!(
            hooks[1]["rules"][0]["resources"],
            json!(["deployments/scale"])
        );
        assert!(hooks[1].get("objectSelector").is_none());
        assert_eq!(
            hooks[1]["matchConditions"][0]["expression"],
            "request.namespace + '/' + request.name in ['capd-system/capd-controller-manager']"
        );
        assert_eq!(hooks[1]["matchConditions"][1]["name"], "scales-up-only");
    }

    #[test]
    fn nothing_pinned_no_scale_entry_and_nothing_installed_nothing_to_copy() {
        let c = configuration(&installed(), "w", None, &selector(), &[]).unwrap();
        assert_eq!(c["webhooks"].as_array().unwrap().len(), 1);
        assert_eq!(c["metadata"]["ownerReferences"], json!([]));
        assert!(configuration(&json!({"webhooks": []}), "w", None, &selector(), &[]).is_none());
        assert!(configuration(&json!({}), "w", None, &selector(), &[]).is_none());
        // Without the Deployment entry, the scale entry's clientConfig serves.
        let only_scale = json!({"webhooks": [installed()["webhooks"][1].clone()]});
        let c = configuration(&only_scale, "w", None, &selector(), &[]).unwrap();
        assert_eq!(
            c["webhooks"][0]["clientConfig"]["url"],
            "https://elsewhere/"
        );
        assert_eq!(c["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn a_name_that_cel_would_misread_is_quoted() {
        let pinned = vec![("a'b".to_string(), "c\\d".to_string())];
        assert_eq!(
            pinned_condition(&pinned),
            format!(
                "request.namespace + '/' + request.name in [{}]",
                crate::admission_policy::cel_str("a'b/c\\d")
            )
        );
    }
}
