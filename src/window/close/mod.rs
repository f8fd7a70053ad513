//! `handoff window close`: set the window Closed, restore every Scale-stopped Deployment
//! (`scaled`), release every held Lease and wait until each controller leads again (`leased`).

mod leased;
mod scaled;

use crate::window::progress::Progress;
use std::time::Duration;

use serde::Serialize;

use crate::resources::move_window::{MoveWindow, MoveWindowStatus, Strategy, WindowState};
use crate::resources::phase::WindowPhase;
use crate::window::cluster::lease;
use crate::window::cluster::now;
use crate::window::cluster::{
    Cluster, Label, Result, WindowError, api_err, labels, read_windows, record, set_state,
};
use crate::window::plan::window_next::{CloseFound, ClosePlanner, CloseRun, CloseStep, Seen};
use crate::window::runner::{self, Performer, Publish};

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
    /// Wait until a pod leads each released Lease. `handoff move` does not for the source:
    /// the target leads already, and nothing of the move waits on the source's candidates
    /// (they take the free Lease at their next try, as after any release).
    pub wait_leading: bool,
    /// Once every cluster's window is closed, remove what the window put in place itself
    /// (`installed::remove`). `handoff move` does it once its record says the move is over.
    pub uninstall: bool,
}

/// What `close` did to one Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    pub cluster: Label,
    pub deployment: String,
    pub strategy: Strategy,
    /// Scale: the count restored. Lease: the count it runs.
    pub replicas: i32,
    /// Lease: the pod that leads again.
    pub leader: Option<String>,
    pub note: Option<String>,
}

/// One run of `close`: each cluster's window as read before the first step, and the status
/// as its `MarkClosed` recorded it.
struct Closer<'a> {
    clusters: &'a [Cluster],
    opts: &'a CloseOptions,
    windows: Vec<Option<MoveWindow>>,
    status: Vec<Option<MoveWindowStatus>>,
    restored: Vec<Restored>,
}

/// Close a window on every cluster in the order given (the caller puts the target first):
/// read, ask `window_next::next_close`, perform the one step, and again.
pub async fn close(
    clusters: &[Cluster],
    opts: &CloseOptions,
    out: &mut Progress,
) -> Result<Vec<Restored>> {
    let k = Closer {
        clusters,
        opts,
        windows: read_windows(clusters, &opts.name).await?,
        status: vec![None; clusters.len()],
        restored: Vec::new(),
    };
    let planner = ClosePlanner {
        window: opts.name.clone(),
        seen: k.windows.iter().map(|w| Seen::of(w.as_ref())).collect(),
    };
    let mut x = CloseRunner { k, out };
    runner::run(&planner, &mut x, Publish::Nested).await?;
    Ok(x.k.restored)
}

/// A `Closer` with where it says what it does, for the runner.
struct CloseRunner<'a, 'o> {
    k: Closer<'a>,
    out: &'o mut Progress,
}

impl Performer<ClosePlanner> for CloseRunner<'_, '_> {
    type Error = WindowError;

    async fn read(&mut self, _: &ClosePlanner, _: &CloseRun) -> Result<()> {
        Ok(())
    }

    async fn perform(&mut self, step: &CloseStep, _: &()) -> Result<CloseFound> {
        let (k, out) = (&mut self.k, &mut *self.out);
        let (clusters, opts) = (k.clusters, k.opts);
        match step {
            CloseStep::Refuse { cluster, why } => {
                return Err(WindowError::WindowRefused {
                    cluster: match cluster {
                        Some(i) => clusters[*i].label.into(),
                        None => labels(clusters),
                    },
                    why: why.clone(),
                });
            }
            CloseStep::MarkClosed {
                cluster,
                closed_before,
            } => k.mark_closed(*cluster, *closed_before, out).await?,
            CloseStep::RestoreScaled(i) => k.restore_scaled(*i, out).await?,
            CloseStep::ReleaseLeases(i) => k.release_leases(*i, out).await?,
            CloseStep::RecordClosed(i) => k.record_closed(*i).await?,
            CloseStep::ReleaseOrphans(i) => match close_deleted(&clusters[*i], opts, out).await? {
                Some(restored) => k.restored.extend(restored),
                None => return Ok(CloseFound::NothingHere),
            },
            CloseStep::Done => {
                if opts.uninstall {
                    for c in clusters {
                        say_removed(c, &opts.name, out).await?;
                    }
                }
            }
        }
        Ok(CloseFound::Did)
    }

    fn progress(&mut self) -> &mut Progress {
        self.out
    }
}

impl Closer<'_> {
    fn window(&self, i: usize) -> &MoveWindow {
        self.windows[i]
            .as_ref()
            .expect("the planner closes only a window it was told was there")
    }

    fn status(&self, i: usize) -> &MoveWindowStatus {
        self.status[i]
            .as_ref()
            .expect("the planner marks a window closed before it restores")
    }

    async fn mark_closed(
        &mut self,
        i: usize,
        closed_before: bool,
        out: &mut Progress,
    ) -> Result<()> {
        let status = mark_closed(
            &self.clusters[i],
            self.opts,
            self.window(i),
            closed_before,
            out,
        )
        .await?;
        self.status[i] = Some(status);
        Ok(())
    }

    async fn restore_scaled(&mut self, i: usize, out: &mut Progress) -> Result<()> {
        let c = &self.clusters[i];
        let restored =
            scaled::restore_all(c, self.opts, self.window(i), self.status(i), out).await?;
        self.restored.extend(restored);
        Ok(())
    }

    async fn release_leases(&mut self, i: usize, out: &mut Progress) -> Result<()> {
        let c = &self.clusters[i];
        let restored = leased::release_leases(c, self.opts, self.status(i), out).await?;
        self.restored.extend(restored);
        Ok(())
    }

    async fn record_closed(&self, i: usize) -> Result<()> {
        record(&self.clusters[i], &self.opts.name, |s| {
            s.phase = Some(WindowPhase::Closed);
            s.closed_at.get_or_insert_with(now);
            s.last_step = Some("restored".into());
        })
        .await
        .map(|_| ())
    }
}

/// Closed first: from here on the webhook lets restores through; then unbound: the restores
/// must not be pinned again inside the API server. The status as recorded.
async fn mark_closed(
    c: &Cluster,
    opts: &CloseOptions,
    w: &MoveWindow,
    closed_before: bool,
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
    // Gone before the restores, which must pass even while handoff is down.
    if remove_window_webhook(c, &opts.name).await? {
        out.detail(format!(
            "{}: removed MutatingWebhookConfiguration {}",
            c.label,
            crate::window::cluster::window_webhook::name(&opts.name)
        ));
    }
    let status = record(c, &opts.name, |s| {
        if !closed_before {
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
    // Its owner's garbage collector removes it too, where one runs.
    if remove_window_webhook(c, &opts.name).await? {
        out.say(format!(
            "{}: there is no MoveWindow {} any more; removed its MutatingWebhookConfiguration {}",
            c.label,
            opts.name,
            crate::window::cluster::window_webhook::name(&opts.name)
        ));
    }
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
            cluster: c.label,
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

/// Remove what the window put in place on `c` itself, and say what went.
pub async fn say_removed(c: &Cluster, window: &str, out: &mut Progress) -> Result<()> {
    let removed = crate::window::cluster::installed::remove(c, window).await?;
    if !removed.is_empty() {
        out.say(format!(
            "{}: removed what MoveWindow {window} brought: {}",
            c.label,
            removed.join(", ")
        ));
    }
    Ok(())
}

/// The window's own webhook configuration deleted; `true` where it was there.
async fn remove_window_webhook(c: &Cluster, window: &str) -> Result<bool> {
    crate::window::cluster::window_webhook::remove(&c.client, window)
        .await
        .map_err(api_err(
            c,
            format!("removing MoveWindow {window}'s webhook configuration"),
        ))
}
