//! A Lease-stopped controller keeps serving: the standby replica `open` adds to a
//! single-replica Deployment before it takes the Lease, and the waits that prove a Deployment
//! has Ready pods and its webhook Services ready endpoints. When to add one and what `close`
//! scales back to is `plan::needs_standby` and `plan::standby_back`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use crate::window::cluster::{Cluster, Result, WindowError, api_err};

/// Scale `ns/name` to `count`.
pub async fn scale(c: &Cluster, ns: &str, name: &str, count: i32) -> Result<()> {
    Api::<Deployment>::namespaced(c.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": count}})),
        )
        .await
        .map_err(api_err(
            c,
            format!("scaling Deployment {ns}/{name} to {count}"),
        ))?;
    Ok(())
}

/// What a Deployment's status says: `Unreported` where no Deployment controller has ever
/// written one (an API server without a controller manager: nothing can be proven from it, and
/// waiting would never end).
enum Counts {
    Gone,
    Unreported,
    /// `status.replicas`, `status.readyReplicas`, and whether the controller has seen the
    /// latest spec.
    Seen {
        replicas: i32,
        ready: i32,
        observed: bool,
    },
}

async fn counts(c: &Cluster, ns: &str, name: &str) -> Result<Counts> {
    let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
    let Some(d) = d else {
        return Ok(Counts::Gone);
    };
    let Some(st) = d
        .status
        .as_ref()
        .filter(|s| s.observed_generation.is_some())
    else {
        return Ok(Counts::Unreported);
    };
    Ok(Counts::Seen {
        replicas: st.replicas.unwrap_or(0),
        ready: st.ready_replicas.unwrap_or(0),
        observed: st.observed_generation >= d.metadata.generation,
    })
}

/// The Deployment's Ready pods, where its status says (`None`: gone or unreported).
pub async fn ready_pods(c: &Cluster, ns: &str, name: &str) -> Result<Option<i32>> {
    Ok(match counts(c, ns, name).await? {
        Counts::Seen {
            ready,
            observed: true,
            ..
        } => Some(ready),
        _ => None,
    })
}

/// Pod `ns/name`, where it is one of `deployment`'s (by its owner, `plan::owned_by_deployment`).
pub async fn deployment_pod(
    c: &Cluster,
    ns: &str,
    name: &str,
    deployment: &str,
) -> Result<Option<Pod>> {
    let p = Api::<Pod>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(c, format!("reading Pod {ns}/{name}")))?;
    Ok(p.filter(|p| {
        let owners: Vec<(String, String)> = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| (o.kind.clone(), o.name.clone()))
            .collect();
        crate::window::plan::stop::owned_by_deployment(name, &owners, deployment)
    }))
}

/// Delete a pod of `deployment` (gracefully: its own termination grace period), checked by
/// its owner; `false` where it is gone, terminating already, or not the Deployment's.
pub async fn delete_pod(c: &Cluster, ns: &str, pod: &str, deployment: &str) -> Result<bool> {
    let api = Api::<Pod>::namespaced(c.client.clone(), ns);
    let Some(p) = deployment_pod(c, ns, pod, deployment).await? else {
        return Ok(false);
    };
    if p.metadata.deletion_timestamp.is_some() {
        return Ok(false);
    }
    match api.delete(pod, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(api_err(c, format!("deleting Pod {ns}/{pod}"))(e)),
    }
}

/// Whether a wait proved what it waited for, or the cluster reports nothing to prove it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    Proven,
    /// Why it could not be told.
    Unreported(String),
}

async fn until(
    c: &Cluster,
    timeout: Duration,
    poll: Duration,
    what: String,
    mut done: impl AsyncFnMut() -> Result<Option<Proof>>,
) -> Result<Proof> {
    let start = Instant::now();
    loop {
        if let Some(p) = done().await? {
            return Ok(p);
        }
        if start.elapsed() >= timeout {
            return Err(WindowError::Timeout {
                cluster: c.label.into(),
                after: timeout,
                what,
            });
        }
        tokio::time::sleep(poll).await;
    }
}

fn unreported(c: &Cluster, ns: &str, name: &str) -> Proof {
    Proof::Unreported(format!(
        "{}: Deployment {ns}/{name} has no status (is a Deployment controller running?), so its Ready pods cannot be told",
        c.label
    ))
}

/// Wait until the Deployment's status, seen by its controller, satisfies `done(replicas,
/// ready)`; proven at once where it is gone, unreported where it has no status.
async fn until_counts(
    c: &Cluster,
    ns: &str,
    name: &str,
    timeout: Duration,
    poll: Duration,
    what: String,
    done: impl Fn(i32, i32) -> bool,
) -> Result<Proof> {
    until(c, timeout, poll, what, async || {
        Ok(match counts(c, ns, name).await? {
            Counts::Gone => Some(Proof::Proven),
            Counts::Unreported => Some(unreported(c, ns, name)),
            Counts::Seen {
                replicas,
                ready,
                observed,
            } => (observed && done(replicas, ready)).then_some(Proof::Proven),
        })
    })
    .await
}

/// Wait until `ns/name` has at least `want` Ready pods.
pub async fn wait_ready(
    c: &Cluster,
    ns: &str,
    name: &str,
    want: i32,
    timeout: Duration,
    poll: Duration,
) -> Result<Proof> {
    let what = format!(
        "waiting for {want} Ready pod{} of Deployment {ns}/{name} (kubectl -n {ns} get pods, and their events, tell why not)",
        if want == 1 { "" } else { "s" }
    );
    until_counts(c, ns, name, timeout, poll, what, |_, ready| ready >= want).await
}

/// Wait until `ns/name` runs exactly `count` pods, all Ready (a scale-down done).
pub async fn wait_settled(
    c: &Cluster,
    ns: &str,
    name: &str,
    count: i32,
    timeout: Duration,
    poll: Duration,
) -> Result<Proof> {
    let what = format!("waiting for Deployment {ns}/{name} to run {count} Ready pods");
    until_counts(c, ns, name, timeout, poll, what, |replicas, ready| {
        replicas == count && ready >= count
    })
    .await
}

/// Whether Service `ns/svc` has a ready endpoint (an EndpointSlice of its, as kube-proxy and
/// the API server's service resolution read them); `None` where it has no EndpointSlice at all.
async fn has_ready_endpoint(c: &Cluster, ns: &str, svc: &str) -> Result<Option<bool>> {
    let slices = Api::<EndpointSlice>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .map_err(api_err(
            c,
            format!("listing EndpointSlices of Service {ns}/{svc}"),
        ))?;
    if slices.items.is_empty() {
        return Ok(None);
    }
    Ok(Some(slices.items.iter().any(|s| {
        s.endpoints.iter().any(|e| {
            e.conditions
                .as_ref()
                .and_then(|c| c.ready)
                // discovery.k8s.io/v1: an unknown state is ready.
                .unwrap_or(true)
        })
    })))
}

/// Wait until each Lease-stopped Deployment has a Ready pod and each webhook Service it backs
/// (`namespace/name`) a ready endpoint: the webhooks serve while its controllers are stopped.
/// What the cluster cannot tell (no Deployment status, no EndpointSlice) is returned, to be
/// said, not waited for.
pub async fn wait_serving(
    c: &Cluster,
    deployments: &[(String, String)],
    services: &[String],
    timeout: Duration,
    poll: Duration,
) -> Result<Vec<String>> {
    let mut untold = Vec::new();
    for (ns, name) in deployments {
        if let Proof::Unreported(why) = wait_ready(c, ns, name, 1, timeout, poll).await? {
            untold.push(why);
        }
    }
    for key in services {
        let (ns, svc) = key.split_once('/').unwrap_or(("", key));
        let proof = until(
            c,
            timeout,
            poll,
            format!("waiting for Service {key} to have a ready endpoint (its webhooks are not served)"),
            async || {
                Ok(match has_ready_endpoint(c, ns, svc).await? {
                    None => Some(Proof::Unreported(format!(
                        "{}: Service {key} has no EndpointSlice (is the EndpointSlice controller running?), so its endpoints cannot be told",
                        c.label
                    ))),
                    Some(true) => Some(Proof::Proven),
                    Some(false) => None,
                })
            },
        )
        .await?;
        if let Proof::Unreported(why) = proof {
            untold.push(why);
        }
    }
    Ok(untold)
}
