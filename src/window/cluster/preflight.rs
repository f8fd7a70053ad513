//! The preflight: which selected Deployments back a webhook or a CRD conversion that fails
//! closed. Stopped by Lease, such a Deployment keeps serving; pinned to 0, it does not.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;

use crate::rules::move_window::OwnDeployment;
use crate::rules::selector::Selector;
use crate::window::cluster::{Cluster, Finding, Result, api_err, dep_key, selected_deployments};

/// The findings said once per Deployment: `cluster: Deployment ns/name backs Service s (3
/// fail-closed webhooks, 1 conversion)`, in the order first found.
pub fn by_deployment(findings: &[Finding]) -> Vec<String> {
    let mut order: Vec<(&str, &str)> = Vec::new();
    // (cluster, deployment) → service → (webhooks, conversions)
    type Backs<'a> = BTreeMap<&'a str, (usize, usize)>;
    let mut services: BTreeMap<(&str, &str), Backs> = BTreeMap::new();
    for f in findings {
        let key = (f.cluster.as_str(), f.deployment.as_str());
        if !order.contains(&key) {
            order.push(key);
        }
        let n = services
            .entry(key)
            .or_default()
            .entry(f.service.as_str())
            .or_default();
        match f.hook.starts_with("CustomResourceDefinition ") {
            true => n.1 += 1,
            false => n.0 += 1,
        }
    }
    let count = |n: usize, one: &str, many: &str| match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    };
    order
        .into_iter()
        .map(|key| {
            let backs: Vec<String> = services[&key]
                .iter()
                .map(|(svc, (hooks, convs))| {
                    let mut what = Vec::new();
                    if *hooks > 0 {
                        what.push(count(*hooks, "fail-closed webhook", "fail-closed webhooks"));
                    }
                    if *convs > 0 {
                        what.push(count(*convs, "CRD conversion", "CRD conversions"));
                    }
                    format!("Service {svc} ({})", what.join(", "))
                })
                .collect();
            format!("{}: Deployment {} backs {}", key.0, key.1, backs.join(", "))
        })
        .collect()
}

/// Every selected Deployment whose pods back a webhook or conversion Service that fails closed.
pub async fn preflight(
    c: &Cluster,
    selector: &Selector,
    own: &OwnDeployment,
) -> Result<Vec<Finding>> {
    let deployments = selected_deployments(c, selector, own).await?;
    if deployments.is_empty() {
        return Ok(vec![]);
    }
    let mut hooks = fail_closed_webhooks(c).await?;
    conversion_webhooks(c, &mut hooks).await?;
    let mut findings = Vec::new();
    let namespaces: BTreeSet<String> = deployments.iter().map(|d| dep_key(d).0).collect();
    for ns in namespaces {
        let services = Api::<Service>::namespaced(c.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(api_err(c, format!("listing Services in {ns}")))?;
        for svc in services {
            let svc_name = svc.metadata.name.clone().unwrap_or_default();
            let Some(callers) = hooks.get(&(ns.clone(), svc_name.clone())) else {
                continue;
            };
            let Some(sel) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
                continue;
            };
            if sel.is_empty() {
                continue;
            }
            for d in deployments.iter().filter(|d| dep_key(d).0 == ns) {
                let pod_labels = d
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
                    .and_then(|m| m.labels.as_ref());
                if !pod_labels.is_some_and(|l| sel.iter().all(|(k, v)| l.get(k) == Some(v))) {
                    continue;
                }
                findings.extend(callers.iter().map(|hook| Finding {
                    cluster: c.label,
                    deployment: format!("{ns}/{}", dep_key(d).1),
                    service: format!("{ns}/{svc_name}"),
                    hook: hook.clone(),
                }));
            }
        }
    }
    Ok(findings)
}

/// (namespace, service) → the hooks that call it and fail closed.
type Hooks = BTreeMap<(String, String), Vec<String>>;

/// Every admission webhook that fails closed, by the Service it calls: both kinds of webhook
/// configuration, flattened to (configuration, webhook, policy, service) so one loop judges
/// them.
async fn fail_closed_webhooks(c: &Cluster) -> Result<Hooks> {
    let mut webhooks = Vec::new();
    for cfg in Api::<ValidatingWebhookConfiguration>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing ValidatingWebhookConfigurations"))?
    {
        let kind = format!(
            "ValidatingWebhookConfiguration {}",
            cfg.metadata.name.clone().unwrap_or_default()
        );
        for w in cfg.webhooks.into_iter().flatten() {
            webhooks.push((
                kind.clone(),
                w.name,
                w.failure_policy,
                w.client_config.service,
            ));
        }
    }
    for cfg in Api::<MutatingWebhookConfiguration>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing MutatingWebhookConfigurations"))?
    {
        let kind = format!(
            "MutatingWebhookConfiguration {}",
            cfg.metadata.name.clone().unwrap_or_default()
        );
        for w in cfg.webhooks.into_iter().flatten() {
            webhooks.push((
                kind.clone(),
                w.name,
                w.failure_policy,
                w.client_config.service,
            ));
        }
    }
    let mut hooks = Hooks::new();
    for (cfg, name, policy, service) in webhooks {
        // admissionregistration/v1 defaults failurePolicy to Fail.
        if policy.as_deref().unwrap_or("Fail") != "Fail" {
            continue;
        }
        if let Some(s) = service {
            hooks
                .entry((s.namespace, s.name))
                .or_default()
                .push(format!("{cfg} webhook {name} (failurePolicy Fail)"));
        }
    }
    Ok(hooks)
}

/// CRD conversion webhooks, by the Service they call: conversion always fails closed.
async fn conversion_webhooks(c: &Cluster, hooks: &mut Hooks) -> Result<()> {
    for crd in Api::<CustomResourceDefinition>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, "listing CustomResourceDefinitions"))?
    {
        let Some(conv) = crd
            .spec
            .conversion
            .as_ref()
            .filter(|c| c.strategy == "Webhook")
        else {
            continue;
        };
        if let Some(s) = conv
            .webhook
            .as_ref()
            .and_then(|w| w.client_config.as_ref())
            .and_then(|cc| cc.service.as_ref())
        {
            hooks
                .entry((s.namespace.clone(), s.name.clone()))
                .or_default()
                .push(format!(
                    "CustomResourceDefinition {} conversion webhook (conversion always fails closed)",
                    crd.metadata.name.clone().unwrap_or_default()
                ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Label;

    fn f(cluster: Label, deployment: &str, service: &str, hook: &str) -> Finding {
        Finding {
            cluster,
            deployment: deployment.into(),
            service: service.into(),
            hook: hook.into(),
        }
    }

    #[test]
    fn one_line_per_deployment_with_what_it_backs() {
        let findings = [
            f(
                Label::Target,
                "capi-system/capi-controller-manager",
                "capi-system/capi-webhook-service",
                "ValidatingWebhookConfiguration v webhook a (failurePolicy Fail)",
            ),
            f(
                Label::Target,
                "capd-system/capd-controller-manager",
                "capd-system/capd-webhook-service",
                "CustomResourceDefinition x conversion webhook (conversion always fails closed)",
            ),
            f(
                Label::Target,
                "capi-system/capi-controller-manager",
                "capi-system/capi-webhook-service",
                "MutatingWebhookConfiguration m webhook b (failurePolicy Fail)",
            ),
            f(
                Label::Target,
                "capi-system/capi-controller-manager",
                "capi-system/capi-webhook-service",
                "CustomResourceDefinition y conversion webhook (conversion always fails closed)",
            ),
            f(
                Label::Source,
                "capi-system/capi-controller-manager",
                "capi-system/capi-webhook-service",
                "ValidatingWebhookConfiguration v webhook a (failurePolicy Fail)",
            ),
        ];
        assert_eq!(
            by_deployment(&findings),
            [
                "target: Deployment capi-system/capi-controller-manager backs Service capi-system/capi-webhook-service (2 fail-closed webhooks, 1 CRD conversion)",
                "target: Deployment capd-system/capd-controller-manager backs Service capd-system/capd-webhook-service (1 CRD conversion)",
                "source: Deployment capi-system/capi-controller-manager backs Service capi-system/capi-webhook-service (1 fail-closed webhook)",
            ]
        );
        assert!(by_deployment(&[]).is_empty());
    }
}
