//! `handoff window close`: set the window Closed, restore every Scale-stopped Deployment
//! (`scaled`), release every held Lease and wait until each controller leads again (`leased`).

mod leased;
mod scaled;

use crate::window::progress::Progress;
use std::time::Duration;

use serde::Serialize;

use super::common::now;
use super::common::{
    Cluster, Result, WindowError, api_err, labels, read_window, record, set_state,
};
use super::lease;
use crate::resources::move_window::{MoveWindow, MoveWindowStatus, Strategy, WindowState};
use crate::resources::phase::WindowPhase;

/// How often `close` reads what it waits for (a restore, a leader again).
pub const CLOSE_POLL: Duration = Duration::from_millis(500);
/// How long after its restores `close` looks again for one pinned anew.
pub const CLOSE_SETTLE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct CloseOptions {
    pub name: String,
    /// How long a restore may keep being re-pinned by a webhook that has not yet seen the
    /// window close.
    pub restore_timeout: Duration,
    pub poll: Duration,
    /// After restoring, wait this long and check again: a handoff replica whose cache lags
    /// may pin a Deployment once more just after it was restored.
    pub settle: Duration,
    /// How long a released Lease may stay without a pod of its Deployment leading.
    pub lead_timeout: Duration,
}

/// What `close` did to one Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    pub cluster: String,
    pub deployment: String,
    pub strategy: Strategy,
    /// Scale: the count restored. Lease: the count it runs.
    pub replicas: i32,
    /// Lease: the pod that leads again.
    pub leader: Option<String>,
    pub note: Option<String>,
}

/// `None` when the cluster has no such window.
async fn close_one(
    c: &Cluster,
    opts: &CloseOptions,
    out: &mut Progress,
) -> Result<Option<Vec<Restored>>> {
    let Some(w) = read_window(c, &opts.name).await? else {
        return close_deleted(c, opts, out).await;
    };
    let status = mark_closed(c, opts, &w, out).await?;
    let mut restored = scaled::restore_all(c, opts, &w, &status, out).await?;
    // Then the Leases, once every Scale-stopped controller runs again.
    restored.extend(leased::release_leases(c, opts, &status, out).await?);
    record(c, &opts.name, |s| {
        s.phase = Some(WindowPhase::Closed);
        s.closed_at.get_or_insert_with(now);
        s.last_step = Some("restored".into());
    })
    .await?;
    Ok(Some(restored))
}

/// Closed first: from here on the webhook lets restores through; then unbound: the restores
/// must not be pinned again inside the API server. The status as recorded.
async fn mark_closed(
    c: &Cluster,
    opts: &CloseOptions,
    w: &MoveWindow,
    out: &mut Progress,
) -> Result<MoveWindowStatus> {
    if w.spec.state != WindowState::Closed {
        set_state(c, &opts.name, WindowState::Closed).await?;
    }
    if crate::admission_policy::apply::unbind_window(&c.client, &opts.name)
        .await
        .map_err(api_err(
            c,
            format!(
                "removing MoveWindow {}'s admission policy bindings",
                opts.name
            ),
        ))?
    {
        out.detail(format!(
            "{}: removed the pin's MutatingAdmissionPolicyBindings of MoveWindow {}",
            c.label, opts.name
        ));
    }
    let status = record(c, &opts.name, |s| {
        if s.phase != Some(WindowPhase::Closed) {
            s.phase = Some(WindowPhase::Closing);
        }
        s.last_step = Some("window-closed".into());
    })
    .await?;
    out.say(format!(
        "{}: MoveWindow {} is closed; restoring",
        c.label, opts.name
    ));
    Ok(status)
}

/// A window deleted without being closed: the Leases it held still say so, and nothing else
/// will ever release them. `None` where it held none.
async fn close_deleted(
    c: &Cluster,
    opts: &CloseOptions,
    out: &mut Progress,
) -> Result<Option<Vec<Restored>>> {
    let orphans = lease::held_anywhere(c, &opts.name, out).await?;
    if orphans.is_empty() {
        out.say(format!(
            "{}: there is no MoveWindow {}: nothing to close here",
            c.label, opts.name
        ));
        return Ok(None);
    }
    let mut restored = Vec::new();
    for (ns, l) in orphans {
        let released = lease::release(c, &ns, &l, &opts.name).await?;
        if released == lease::Released::AlreadyFree {
            continue;
        }
        match &released {
            lease::Released::TakenBack(holder) => {
                out.say(format!("{}: there is no MoveWindow {} any more; Lease {ns}/{l} still carried its label, held by {} since: removed the label, left the holder",
                c.label,
                opts.name,
                who(holder)));
            }
            _ => {
                out.say(format!("{}: there is no MoveWindow {} any more; released Lease {ns}/{l}, which it still held",
                c.label, opts.name));
            }
        }
        restored.push(Restored {
            cluster: c.label.clone(),
            deployment: format!("{ns}/(Lease {l})"),
            strategy: Strategy::Lease,
            replicas: 0,
            leader: None,
            note: Some("released from a deleted MoveWindow".into()),
        });
    }
    Ok(Some(restored))
}

fn who(holder: &str) -> &str {
    match holder {
        "" => "nobody (written free by someone else)",
        h => h,
    }
}

/// Close a window on every cluster in the order given (the caller puts the target first).
pub async fn close(
    clusters: &[Cluster],
    opts: &CloseOptions,
    out: &mut Progress,
) -> Result<Vec<Restored>> {
    // A cluster without the window (an `open` that died before creating it there) does not
    // stop the others from closing; a name that exists nowhere is an error.
    let mut all = Vec::new();
    let mut found = false;
    for c in clusters {
        if let Some(restored) = close_one(c, opts, out).await? {
            found = true;
            all.extend(restored);
        }
    }
    if !found {
        return Err(WindowError::Refused {
            cluster: labels(clusters),
            message: format!("there is no MoveWindow {}: nothing to close", opts.name),
        });
    }
    Ok(all)
}
