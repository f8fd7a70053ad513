//! `handoff window status`: each window, each stopped Deployment, how it is stopped, and what
//! it will be restored to or which Lease is held for it.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use crate::resources::move_window::{
    MoveRole, MoveWindow, PinnedDeployment, Strategy, WindowState,
};
use crate::rules::move_window::{OwnDeployment, SAVED_REPLICAS_ANNOTATION};
use crate::window::cluster::lease;
use crate::window::cluster::{
    Cluster, Label, Result, api_err, dep_key, read_window, selected_deployments,
};

/// One window as `handoff window status` reports it, with the live state of its Deployments.
#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    pub cluster: Label,
    pub name: String,
    pub state: WindowState,
    pub phase: Option<String>,
    pub role: Option<MoveRole>,
    pub reason: Option<String>,
    pub created: Option<String>,
    pub last_step: Option<String>,
    /// Who opened it: the only user who may write its held Leases.
    pub operator: Option<String>,
    pub deployments: Vec<DeploymentReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeploymentReport {
    pub namespace: String,
    pub name: String,
    /// How the window stops it (`None`: selected, not stopped yet).
    pub strategy: Option<Strategy>,
    /// `spec.replicas` now.
    pub replicas: Option<i32>,
    /// The annotation now.
    pub saved_annotation: Option<String>,
    /// What the window recorded.
    pub recorded: Option<i32>,
    pub restored_at: Option<String>,
    pub note: Option<String>,
    /// Lease: when no former leader can be leading any more.
    pub stopped_since: Option<String>,
    pub leases: Vec<LeaseReport>,
}

/// One Lease a window holds or held for a Deployment.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseReport {
    pub name: String,
    /// The window that holds it now, read from the Lease (`None`: free or taken back).
    pub held_by: Option<String>,
    /// Its holder identity now (a pod's, where the Lease was taken back or released).
    pub holder: String,
    /// The window its label still names while another holder (or nobody) holds it.
    pub taken_back: Option<String>,
    pub former_holder: String,
    pub former_lease_duration_seconds: i32,
    pub held_since: Option<String>,
    pub released_at: Option<String>,
    pub leads_again: Option<String>,
}

pub async fn status(
    clusters: &[Cluster],
    name: Option<&str>,
    own: &OwnDeployment,
) -> Result<Vec<WindowReport>> {
    let mut views = Vec::new();
    for c in clusters {
        let windows = match name {
            Some(n) => read_window(c, n).await?.into_iter().collect::<Vec<_>>(),
            None => match Api::<MoveWindow>::all(c.client.clone())
                .list(&ListParams::default())
                .await
            {
                Ok(l) => l.items,
                // No MoveWindow CRD: nothing of handoff installed, and no window open.
                Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
                Err(e) => return Err(api_err(c, "listing MoveWindows")(e)),
            },
        };
        for w in windows {
            views.push(window_report(c, &w, own).await?);
        }
    }
    Ok(views)
}

/// One window as it stands: every Deployment it recorded and, while it is open, every one it
/// selects.
async fn window_report(c: &Cluster, w: &MoveWindow, own: &OwnDeployment) -> Result<WindowReport> {
    let status = w.status.clone().unwrap_or_default();
    let mut keys: BTreeSet<(String, String)> = status
        .pinned
        .iter()
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .collect();
    if w.spec.is_open()
        && let Ok(sel) = w.spec.selector()
    {
        for d in selected_deployments(c, &sel, own).await? {
            keys.insert(dep_key(&d));
        }
    }
    let mut deployments = Vec::new();
    for (ns, dname) in keys {
        let rec = status
            .pinned
            .iter()
            .find(|p| p.namespace == ns && p.name == dname);
        deployments.push(deployment_report(c, ns, dname, rec).await?);
    }
    Ok(WindowReport {
        cluster: c.label,
        name: w.metadata.name.clone().unwrap_or_default(),
        state: w.spec.state,
        phase: status.phase.as_ref().map(|p| p.to_string()),
        role: w.spec.role,
        reason: w.spec.reason.clone(),
        created: w
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        last_step: status.last_step.clone(),
        operator: status.operator.clone(),
        deployments,
    })
}

/// One Deployment as the window recorded it and as it is: its count, its annotation, and who
/// holds each of its Leases now.
async fn deployment_report(
    c: &Cluster,
    ns: String,
    dname: String,
    rec: Option<&PinnedDeployment>,
) -> Result<DeploymentReport> {
    let d = Api::<Deployment>::namespaced(c.client.clone(), &ns)
        .get_opt(&dname)
        .await
        .map_err(api_err(c, format!("reading Deployment {ns}/{dname}")))?;
    let mut leases = Vec::new();
    for l in rec.map(|p| p.leases.as_slice()).unwrap_or_default() {
        let (held_by, holder, taken_back) = lease::held_by(c, &ns, &l.name).await?;
        leases.push(LeaseReport {
            held_by,
            holder,
            taken_back,
            name: l.name.clone(),
            former_holder: l.former_holder.clone(),
            former_lease_duration_seconds: l.former_lease_duration_seconds,
            held_since: l.held_since.clone(),
            released_at: l.released_at.clone(),
            leads_again: l.leads_again.clone(),
        });
    }
    Ok(DeploymentReport {
        strategy: rec.map(|p| p.strategy()),
        stopped_since: rec.and_then(|p| p.stopped_since.clone()),
        leases,
        replicas: d.as_ref().and_then(|d| d.spec.as_ref()?.replicas),
        saved_annotation: d.as_ref().and_then(|d| {
            d.metadata
                .annotations
                .as_ref()?
                .get(SAVED_REPLICAS_ANNOTATION)
                .cloned()
        }),
        recorded: rec.map(|p| p.saved_replicas),
        restored_at: rec.and_then(|p| p.restored_at.clone()),
        note: rec.and_then(|p| p.note.clone()),
        namespace: ns,
        name: dname,
    })
}

/// The `status` table.
pub fn render_table(views: &[WindowReport]) -> String {
    let mut s = String::new();
    if views.is_empty() {
        return "no MoveWindows\n".into();
    }
    let dash = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    for v in views {
        s.push_str(&format!(
            "{:<8} {:<24} {:<7} {:<8} {:<7} {}\n",
            "CLUSTER", "WINDOW", "STATE", "PHASE", "ROLE", "REASON"
        ));
        s.push_str(&format!(
            "{:<8} {:<24} {:<7} {:<8} {:<7} {}\n",
            v.cluster,
            v.name,
            format!("{:?}", v.state),
            dash(v.phase.clone()),
            dash(v.role.map(|r| format!("{r:?}").to_lowercase())),
            dash(v.reason.clone()),
        ));
        if let Some(op) = &v.operator {
            s.push_str(&format!("  operator: {op}\n"));
        }
        if v.deployments.is_empty() {
            s.push_str("  (no Deployments stopped)\n\n");
            continue;
        }
        s.push_str(&format!(
            "  {:<56} {:<5} {:>8} {:>6} {:>8}  {}\n",
            "DEPLOYMENT", "STOP", "REPLICAS", "SAVED", "RECORDED", "RESTORED"
        ));
        for d in &v.deployments {
            s.push_str(&format!(
                "  {:<56} {:<5} {:>8} {:>6} {:>8}  {}{}\n",
                format!("{}/{}", d.namespace, d.name),
                dash(d.strategy.map(|s| format!("{s:?}"))),
                dash(d.replicas.map(|r| r.to_string())),
                dash(d.saved_annotation.clone()),
                dash(d.recorded.map(|r| r.to_string())),
                dash(d.restored_at.clone()),
                d.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default(),
            ));
            for l in &d.leases {
                let state = match (&l.held_by, &l.released_at) {
                    (Some(w), _) if *w == v.name => "held".to_string(),
                    (Some(w), _) => format!("held by MoveWindow {w}"),
                    (None, Some(_)) => "released".to_string(),
                    (None, None) if l.taken_back.as_deref() == Some(v.name.as_str()) => format!(
                        "TAKEN BACK: held by {} although the window never released it (its controllers may be running)",
                        if l.holder.is_empty() {
                            "nobody (written free by someone)"
                        } else {
                            &l.holder
                        }
                    ),
                    (None, None) => "not held".to_string(),
                };
                s.push_str(&format!(
                    "    Lease {}: {state}; former holder {} (leaseDurationSeconds {}), held since {}, stopped since {}{}\n",
                    l.name,
                    if l.former_holder.is_empty() { "nobody" } else { &l.former_holder },
                    l.former_lease_duration_seconds,
                    dash(l.held_since.clone()),
                    dash(d.stopped_since.clone()),
                    match (&l.released_at, &l.leads_again) {
                        (Some(r), Some(p)) => format!(", released {r}, {p} leads again"),
                        (Some(r), None) => format!(", released {r}"),
                        _ => String::new(),
                    }
                ));
            }
        }
        s.push('\n');
    }
    s
}
