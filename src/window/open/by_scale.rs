//! Stopping by Scale in `handoff window open`: each Deployment pinned to 0 with its count
//! saved, the API server's own pin proven in force, and the wait for the pods to be gone.

use crate::window::progress::Progress;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use super::OpenOptions;
use crate::rules::move_window::SAVED_REPLICAS_ANNOTATION;
use crate::rules::selector::Selector;
use crate::window::cluster::{Cluster, Result, WindowError, api_err, labels};
use crate::window::plan::stop::{self, PinPlan};

/// Scale one Deployment to 0, saving its count in the annotation. Returns the saved count.
pub async fn pin_deployment(c: &Cluster, ns: &str, name: &str, out: &mut Progress) -> Result<i32> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    for _attempt in 0..5 {
        let d = api
            .get(name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
        let (patch, saved_now) = match stop::pin_plan(&d) {
            PinPlan::AlreadyPinned(s) => {
                out.say(format!(
                    "{}: {ns}/{name} already pinned (restores to {s})",
                    c.label
                ));
                return Ok(s.0);
            }
            // Pinned, with an annotation nobody can read: leave it for close to report.
            PinPlan::PinnedUnreadable => return Ok(1),
            PinPlan::Save(n) => {
                let mut patch = json!({"metadata": {
                    "resourceVersion": d.metadata.resource_version,
                    "annotations": {SAVED_REPLICAS_ANNOTATION: n.to_string()}
                }});
                if n > 0 {
                    patch["spec"] = json!({"replicas": 0});
                }
                (patch, n)
            }
        };
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                out.say(format!(
                    "{}: pinned {ns}/{name} to 0 replicas (was {saved_now})",
                    c.label
                ));
                return Ok(saved_now);
            }
            // Someone changed it between our read and write: read again.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(api_err(c, format!("pinning Deployment {ns}/{name}"))(e)),
        }
    }
    Err(WindowError::Refused {
        cluster: c.label.into(),
        message: format!("Deployment {ns}/{name} kept changing under us; run the command again"),
    })
}

/// Wait until the API server enforces the pin's admission policies bound to the window: its
/// policy and parameter caches follow the writes by a moment. A server-side dry run that asks
/// a pinned Deployment (and its scale) for one replica must come back with zero.
pub async fn wait_policy_in_force(
    c: &Cluster,
    (ns, name): &(String, String),
    out: &mut Progress,
) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let ask = Patch::Merge(json!({"spec": {"replicas": 1}}));
    let start = tokio::time::Instant::now();
    loop {
        let d = api
            .patch(name, &dry, &ask)
            .await
            .map_err(api_err(c, format!("dry-run scaling {ns}/{name}")))?;
        let s = api
            .patch_scale(name, &dry, &ask)
            .await
            .map_err(api_err(c, format!("dry-run scaling {ns}/{name}/scale")))?;
        // A Scale at 0 omits `replicas` (omitempty); a Deployment writes it out.
        if d.spec.and_then(|s| s.replicas) == Some(0)
            && s.spec.and_then(|s| s.replicas).unwrap_or(0) == 0
        {
            out.detail(format!("{}: pinned in the API server: a dry run asking {ns}/{name} (and its scale) for 1 replica comes back at 0",
                c.label));
            return Ok(());
        }
        if start.elapsed() >= Duration::from_secs(15) {
            out.warn(format!("{}: after 15s a dry run of {ns}/{name} at 1 replica is still not pinned by the API server's admission policies; the webhook pins meanwhile, if it runs",
                c.label));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Pods of the given Deployments that still exist (terminating ones included).
pub async fn remaining_pods(
    c: &Cluster,
    keys: &[(String, String)],
) -> Result<Vec<(String, usize)>> {
    let mut left = Vec::new();
    for (ns, name) in keys {
        let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(api_err(c, format!("reading Deployment {ns}/{name}")))?;
        let Some(sel) = d
            .as_ref()
            .and_then(|d| d.spec.as_ref())
            .map(|s| &s.selector)
        else {
            continue;
        };
        let sel = Selector::from_label_selector(sel).map_err(|e| WindowError::Refused {
            cluster: c.label.into(),
            message: format!("Deployment {ns}/{name}: {e}"),
        })?;
        if sel.0.is_empty() {
            continue;
        }
        let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
            .list(&ListParams::default().labels(&sel.to_string()))
            .await
            .map_err(api_err(c, format!("listing pods of {ns}/{name}")))?;
        if !pods.items.is_empty() {
            left.push((format!("{ns}/{name}"), pods.items.len()));
        }
    }
    Ok(left)
}

pub async fn wait_pods_gone(
    clusters: &[(Cluster, Vec<(String, String)>)],
    opts: &OpenOptions,
    out: &mut Progress,
) -> Result<()> {
    let start = tokio::time::Instant::now();
    let mut last = String::new();
    loop {
        let mut waiting = Vec::new();
        for (c, keys) in clusters {
            for (d, n) in remaining_pods(c, keys).await? {
                waiting.push(format!("{}: {d} ({n} pods)", c.label));
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let line = waiting.join(", ");
        if line != last {
            out.say(format!("waiting for pods to be gone: {line}"));
            last = line;
        }
        if start.elapsed() >= opts.wait_timeout {
            return Err(WindowError::Timeout {
                cluster: labels(clusters.iter().map(|(c, _)| c)),
                after: opts.wait_timeout,
                what: format!("waiting for pods to be gone ({last})"),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}
