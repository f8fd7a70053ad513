//! A Lease-stopped controller keeps serving: the standby replica `open` adds to a
//! single-replica Deployment before it takes the Lease, and the waits that prove a Deployment
//! has Ready pods and its webhook Services ready endpoints. When to add one and what `close`
//! scales back to is `plan::needs_standby` and `plan::standby_back`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::common::{Cluster, Result, WindowError, api_err};

/// Scale `ns/name` to `count`.
pub async fn scale(c: &Cluster, ns: &str, name: &str, count: i32) -> Result<()> {
    Api::<Deployment>::namespaced(c.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": count}})),
        )
        .await
        .map_err(api_err(c, format!("scaling Deployment {ns}/{name} to {count}")))?;
    Ok(())
}

/// `(spec.replicas, status.replicas, status.readyReplicas, observed)`: `observed` when the
/// Deployment controller has seen the latest spec.
async fn counts(c: &Cluster, ns: &str, name: &str) -> Result<Option<(i32, i32, i32, bool)>> {
    let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
    Ok(d.map(|d| {
        let spec = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.as_ref();
        let observed = st.and_then(|s| s.observed_generation) >= d.metadata.generation;
        (
            spec,
            st.and_then(|s| s.replicas).unwrap_or(0),
            st.and_then(|s| s.ready_replicas).unwrap_or(0),
            observed,
        )
    }))
}

async fn until(
    c: &Cluster,
    timeout: Duration,
    poll: Duration,
    what: String,
    mut done: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if done().await? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(WindowError::Timeout {
                cluster: c.label.clone(),
                after: timeout,
                what,
            });
        }
        tokio::time::sleep(poll).await;
    }
}

/// Wait until `ns/name` has at least `want` Ready pods.
pub async fn wait_ready(
    c: &Cluster,
    ns: &str,
    name: &str,
    want: i32,
    timeout: Duration,
    poll: Duration,
) -> Result<()> {
    until(
        c,
        timeout,
        poll,
        format!(
            "waiting for {want} Ready pod{} of Deployment {ns}/{name} (kubectl -n {ns} get pods, and their events, tell why not)",
            if want == 1 { "" } else { "s" }
        ),
        async || Ok(counts(c, ns, name).await?.is_none_or(|(_, _, ready, observed)| observed && ready >= want)),
    )
    .await
}

/// Wait until `ns/name` runs exactly `count` pods, all Ready (a scale-down done).
pub async fn wait_settled(
    c: &Cluster,
    ns: &str,
    name: &str,
    count: i32,
    timeout: Duration,
    poll: Duration,
) -> Result<()> {
    until(
        c,
        timeout,
        poll,
        format!("waiting for Deployment {ns}/{name} to run {count} Ready pods"),
        async || {
            Ok(counts(c, ns, name)
                .await?
                .is_none_or(|(_, replicas, ready, observed)| {
                    observed && replicas == count && ready >= count
                }))
        },
    )
    .await
}

/// Whether Service `ns/svc` has a ready endpoint (an EndpointSlice of its, as kube-proxy and
/// the API server's service resolution read them).
async fn has_ready_endpoint(c: &Cluster, ns: &str, svc: &str) -> Result<bool> {
    let slices = Api::<EndpointSlice>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .map_err(api_err(c, format!("listing EndpointSlices of Service {ns}/{svc}")))?;
    Ok(slices.items.iter().any(|s| {
        s.endpoints.iter().any(|e| {
            e.conditions
                .as_ref()
                .and_then(|c| c.ready)
                // discovery.k8s.io/v1: an unknown state is ready.
                .unwrap_or(true)
        })
    }))
}

/// Wait until each Lease-stopped Deployment has a Ready pod and each webhook Service it backs
/// (`namespace/name`) a ready endpoint: the webhooks serve while its controllers are stopped.
pub async fn wait_serving(
    c: &Cluster,
    deployments: &[(String, String)],
    services: &[String],
    timeout: Duration,
    poll: Duration,
) -> Result<()> {
    for (ns, name) in deployments {
        wait_ready(c, ns, name, 1, timeout, poll).await?;
    }
    for key in services {
        let (ns, svc) = key.split_once('/').unwrap_or(("", key));
        until(
            c,
            timeout,
            poll,
            format!("waiting for Service {key} to have a ready endpoint (its webhooks are not served)"),
            async || has_ready_endpoint(c, ns, svc).await,
        )
        .await?;
    }
    Ok(())
}
