//! `handoff move --to-directory` and `--from-directory`: clusterctl's backup and restore as a
//! child process, with the one cluster's controllers stopped around it (`directory_plan`
//! decides; this file reads, writes and runs).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::super::child::Child;
use super::super::close::{CloseOptions, close, say_removed};
use super::super::common::{Cluster, Result, WindowError, now, read_window, record};
use super::super::directory_plan::{self, Direction, DirectoryFlags, DirectoryStep, Then};
use super::super::open::{OpenOptions, check, open, window_at_least_closed};
use super::super::progress::{Format, Progress};
use super::super::user_agent::StepLabel;
use super::cluster_api::{CLUSTERS, clusters_in, patch, scan};
use crate::resources::move_window::MoveRecord;
use crate::resources::phase::MovePhase;

#[derive(Debug, Clone)]
pub struct DirectoryOptions {
    pub window: String,
    pub flags: DirectoryFlags,
    pub clusterctl: PathBuf,
    pub abort: bool,
    pub open: OpenOptions,
    /// Its `uninstall` is not used: a run removes what its window brought at its very end.
    pub close: CloseOptions,
    /// How often the Clusters are read while the providers lift their block-move.
    pub poll: Duration,
    /// The step performed now, on each request's User-Agent (`(backup step Stop)`).
    pub step_label: StepLabel,
}

impl DirectoryOptions {
    /// How the window is closed: what it brought stays until the run has recorded its end.
    fn closing(&self) -> CloseOptions {
        CloseOptions {
            uninstall: false,
            ..self.close.clone()
        }
    }

    /// Say that the run performs `step` (an event under `-o json`, a line under `-v`, and the
    /// User-Agent of its requests from now on).
    fn step(&self, out: &mut Progress, step: DirectoryStep) {
        let of = self.flags.direction.of();
        self.step_label.set(of, step);
        out.step(of, step);
    }
}

/// One backup or restore, from start to end, or its `--abort`; a run that died is put back
/// (a backup) or resumed (a restore) by the same command.
pub async fn run(c: &Cluster, o: &DirectoryOptions, out: &mut Progress) -> Result<()> {
    let started = Instant::now();
    let what = o.flags.direction.of().as_str();
    let window = read_window(c, &o.window).await?;
    let is_open = window.as_ref().is_some_and(|w| w.spec.is_open());
    let rec = window
        .as_ref()
        .and_then(|w| w.status.as_ref())
        .and_then(|s| s.move_record.clone());
    let ns = match &o.flags.direction {
        Direction::Backup { namespace } => Some(namespace.clone()),
        Direction::Restore => None,
    };
    let clusters = match &ns {
        Some(ns) => clusters_in(c, ns).await?,
        None => Vec::new(),
    };
    let start = directory_plan::start(
        &o.flags.direction,
        o.abort,
        &o.window,
        is_open,
        rec.as_ref(),
        &clusters,
    );
    if rec.is_some() || is_open {
        out.say(format!(
            "handoff move: MoveWindow {} records a {what}{} that did not finish; {}",
            o.window,
            rec.as_ref()
                .map(|r| format!(" (phase {}, attempt {})", r.phase, r.attempts))
                .unwrap_or_default(),
            match (&start.then, o.abort) {
                (_, true) => "putting everything back",
                (
                    Then::Run {
                        stopped_already: true,
                    },
                    _,
                ) => "its controllers stay stopped, and clusterctl runs again",
                _ => "putting it back, then running it again",
            }
        ));
    }
    if !start.unpause.is_empty() || start.close {
        o.step(out, DirectoryStep::PutBack);
    }
    for key in &start.unpause {
        set_paused(c, key, false).await?;
        out.say(format!(
            "{}: unpaused Cluster {key} (paused for the backup recorded in MoveWindow {})",
            c.label, o.window
        ));
    }
    if start.close {
        set_phase(c, &o.window, MovePhase::Aborting).await?;
        close(std::slice::from_ref(c), &o.closing(), out).await?;
    }
    match start.then {
        Then::Refuse(message) => {
            o.step(out, DirectoryStep::Refuse);
            uninstall(c, o, out).await?;
            return Err(WindowError::Refused {
                cluster: c.label.clone(),
                message,
            });
        }
        Then::Aborted => {
            o.step(out, DirectoryStep::Aborted);
            if rec.is_some() {
                set_phase(c, &o.window, MovePhase::Aborted).await?;
            }
            uninstall(c, o, out).await?;
            if let Direction::Restore = o.flags.direction {
                out.say("handoff move --abort: the controllers are back; what clusterctl restored stays as it is (its Clusters paused where clusterctl stopped before unpausing them): kubectl --kubeconfig … get clusters.cluster.x-k8s.io -A -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,PAUSED:.spec.paused");
            } else {
                out.say(
                    "handoff move --abort: the controllers and the Clusters are back as they were",
                );
            }
            return Ok(());
        }
        Then::Run { stopped_already } => {
            match &ns {
                Some(ns) => backup(c, o, ns, &clusters, out).await?,
                None => restore(c, o, stopped_already, out).await?,
            };
        }
    }
    o.step(out, DirectoryStep::Done);
    out.say(format!(
        "handoff move: {what} done in {:.1}s ({})",
        started.elapsed().as_secs_f64(),
        o.flags.directory.display()
    ));
    Ok(())
}

async fn set_phase(c: &Cluster, window: &str, phase: MovePhase) -> Result<()> {
    note(c, window, |m| m.phase = phase.clone()).await
}

/// Change the record, where the window is there (an `--abort` may find none).
async fn note(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    if read_window(c, window).await?.is_none() {
        return Ok(());
    }
    record(c, window, |s| {
        f(s.move_record.get_or_insert_with(MoveRecord::default))
    })
    .await
    .map(|_| ())
}

/// What the window brought, removed once the run has recorded how it ended (`close` itself is
/// asked to leave it: removing the CRD deletes the window and its record with it).
async fn uninstall(c: &Cluster, o: &DirectoryOptions, out: &mut Progress) -> Result<()> {
    o.step(out, DirectoryStep::Uninstall);
    say_removed(c, &o.window, out).await
}

/// Pause the Clusters (recorded first), wait for the providers' block-move to go, stop and
/// prove the controllers, unpause the Clusters, run clusterctl; then, however that went, put
/// everything back: the Clusters unpaused, the controllers restored.
async fn backup(
    c: &Cluster,
    o: &DirectoryOptions,
    ns: &str,
    clusters: &[super::super::move_plan::ClusterSeen],
    out: &mut Progress,
) -> Result<()> {
    o.step(out, DirectoryStep::Check);
    check(std::slice::from_ref(c), &o.open, out).await?;
    let quiet = OpenOptions {
        quiet_preflight: true,
        ..o.open.clone()
    };
    // The window and its record before the first pause: a run that dies after it is put back.
    o.step(out, DirectoryStep::Record);
    let read = read_window(c, &o.window).await?;
    window_at_least_closed(c, &quiet, read).await?;
    let keys: Vec<String> = clusters.iter().map(|k| k.key.clone()).collect();
    record(c, &o.window, |s| {
        let attempts = s.move_record.as_ref().map_or(0, |m| m.attempts);
        s.move_record = Some(MoveRecord {
            phase: MovePhase::StoppingSource,
            namespace: ns.to_string(),
            started_at: Some(now()),
            attempts: attempts + 1,
            clusters: keys.clone(),
            ..MoveRecord::default()
        });
    })
    .await?;
    let ran = stop_and_back_up(c, o, &quiet, ns, &keys, out).await;
    // clusterctl unpauses at its end; a run that stopped before may have left them paused.
    o.step(out, DirectoryStep::PutBack);
    let now_seen = clusters_in(c, ns).await?;
    for key in super::super::move_plan::to_unpause(&[], &keys, &now_seen) {
        set_paused(c, &key, false).await?;
        out.say(format!("{}: unpaused Cluster {key}", c.label));
    }
    if read_window(c, &o.window)
        .await?
        .is_some_and(|w| w.spec.is_open())
    {
        note(c, &o.window, |m| m.phase = MovePhase::Restoring).await?;
        close(std::slice::from_ref(c), &o.closing(), out).await?;
    }
    match ran {
        Ok(()) => {
            note(c, &o.window, |m| {
                m.phase = MovePhase::Done;
                m.source_back_at.get_or_insert_with(now);
            })
            .await?;
            uninstall(c, o, out).await
        }
        Err(e) => {
            o.step(out, DirectoryStep::Fail);
            note(c, &o.window, |m| {
                m.phase = MovePhase::Failed;
                m.clusterctl_exit = clusterctl_exit(&e);
                m.error = Some(e.to_string());
            })
            .await?;
            uninstall(c, o, out).await?;
            out.say("The controllers and the Clusters are back as they were; whatever clusterctl wrote to the folder is incomplete. Run the same command again.");
            Err(e)
        }
    }
}

async fn stop_and_back_up(
    c: &Cluster,
    o: &DirectoryOptions,
    quiet: &OpenOptions,
    ns: &str,
    keys: &[String],
    out: &mut Progress,
) -> Result<()> {
    o.step(out, DirectoryStep::Pause);
    for key in keys {
        set_paused(c, key, true).await?;
    }
    if !keys.is_empty() {
        out.say(format!(
            "{}: paused Cluster {}, so that the providers finish what they are doing and lift their block-move (a backup alone does not wait for it)",
            c.label,
            keys.join(", ")
        ));
    }
    o.step(out, DirectoryStep::WaitUnblocked);
    wait_unblocked(c, o, ns, out).await?;
    o.step(out, DirectoryStep::Stop);
    open(std::slice::from_ref(c), quiet, out).await?;
    note(c, &o.window, |m| {
        m.phase = MovePhase::Copying;
        m.source_stopped_at.get_or_insert_with(now);
    })
    .await?;
    o.step(out, DirectoryStep::Unpause);
    for key in keys {
        set_paused(c, key, false).await?;
    }
    if !keys.is_empty() {
        out.say(format!(
            "{}: unpaused Cluster {} again (nothing reconciles it now; clusterctl refuses a paused Cluster, and pauses it itself)",
            c.label,
            keys.join(", ")
        ));
    }
    clusterctl(c, o, out).await
}

/// Set one Cluster's `spec.paused` (a merge patch, retried while a provider's webhook blinks).
async fn set_paused(c: &Cluster, key: &str, paused: bool) -> Result<()> {
    let what = if paused { "pausing" } else { "unpausing" };
    patch(c, CLUSTERS, key, json!({"spec": {"paused": paused}}), what)
        .await
        .map(|_| ())
}

/// Wait until every Cluster is paused and no object of the namespace holds a block-move.
async fn wait_unblocked(
    c: &Cluster,
    o: &DirectoryOptions,
    ns: &str,
    out: &mut Progress,
) -> Result<()> {
    let deadline = Instant::now() + o.open.wait_timeout;
    let mut said = None;
    loop {
        let clusters = clusters_in(c, ns).await?;
        let blocking = scan(c, ns).await?.blocking;
        let why = match directory_plan::backup_ready(&clusters, &blocking) {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(WindowError::Refused {
                cluster: c.label.clone(),
                message: format!(
                    "still waiting for {why} after {}s (--wait-timeout): the providers hold the namespace; run the same command again once they are done",
                    o.open.wait_timeout.as_secs()
                ),
            });
        }
        if said.as_ref() != Some(&why) {
            out.say(format!("handoff move: waiting for {why}"));
            said = Some(why);
        }
        tokio::time::sleep(o.poll).await;
    }
}

/// Stop and prove the target's controllers (unless a run before this one did), run
/// clusterctl's restore, and restore them only once it succeeded.
async fn restore(
    c: &Cluster,
    o: &DirectoryOptions,
    stopped_already: bool,
    out: &mut Progress,
) -> Result<()> {
    if !stopped_already {
        o.step(out, DirectoryStep::Check);
        check(std::slice::from_ref(c), &o.open, out).await?;
        let quiet = OpenOptions {
            quiet_preflight: true,
            ..o.open.clone()
        };
        o.step(out, DirectoryStep::Record);
        let read = read_window(c, &o.window).await?;
        window_at_least_closed(c, &quiet, read).await?;
        record(c, &o.window, |s| {
            let attempts = s.move_record.as_ref().map_or(0, |m| m.attempts);
            s.move_record = Some(MoveRecord {
                phase: MovePhase::StoppingTarget,
                namespace: String::new(),
                started_at: Some(now()),
                attempts: attempts + 1,
                ..MoveRecord::default()
            });
        })
        .await?;
        o.step(out, DirectoryStep::Stop);
        open(std::slice::from_ref(c), &quiet, out).await?;
    }
    note(c, &o.window, |m| {
        m.phase = MovePhase::Copying;
        m.target_stopped_at.get_or_insert_with(now);
        m.error = None;
    })
    .await?;
    if let Err(e) = clusterctl(c, o, out).await {
        o.step(out, DirectoryStep::Fail);
        note(c, &o.window, |m| {
            m.phase = MovePhase::Failed;
            m.clusterctl_exit = clusterctl_exit(&e);
            m.error = Some(e.to_string());
        })
        .await?;
        out.say(format!(
            "The controllers handoff stopped stay stopped, and MoveWindow {} stays open: they would reconcile a half-restored management cluster. Two ways on:\n  finish the restore: the same command again (clusterctl creates what is missing and updates what is there)\n  undo the stop:      the same command with --abort (the controllers come back; what was restored stays)",
            o.window
        ));
        return Err(e);
    }
    o.step(out, DirectoryStep::Restore);
    note(c, &o.window, |m| m.phase = MovePhase::Restoring).await?;
    close(std::slice::from_ref(c), &o.closing(), out).await?;
    note(c, &o.window, |m| {
        m.phase = MovePhase::Done;
        m.target_back_at.get_or_insert_with(now);
    })
    .await?;
    uninstall(c, o, out).await
}

/// clusterctl's exit code, where it was clusterctl that failed (recorded, as a move's).
fn clusterctl_exit(e: &WindowError) -> Option<i32> {
    match e {
        WindowError::Clusterctl { code, .. } => Some(*code),
        _ => None,
    }
}

/// clusterctl, with the controllers stopped; its output as a move's.
async fn clusterctl(c: &Cluster, o: &DirectoryOptions, out: &mut Progress) -> Result<()> {
    o.step(out, DirectoryStep::RunClusterctl);
    let args = directory_plan::clusterctl_args(&o.flags);
    out.say(format!(
        "handoff move: running {} {}",
        o.clusterctl.display(),
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let t = Instant::now();
    let mut child =
        Child::spawn(&o.clusterctl, args, out.format() == Format::Json).map_err(|e| {
            WindowError::Refused {
                cluster: c.label.clone(),
                message: e.to_string(),
            }
        })?;
    let status = child.wait().await.map_err(|e| WindowError::Refused {
        cluster: c.label.clone(),
        message: format!("waiting for clusterctl: {e}"),
    })?;
    out.say(format!(
        "handoff move: clusterctl exited {} ({:.1}s)",
        status.describe(),
        t.elapsed().as_secs_f64()
    ));
    match status.code {
        Some(0) => Ok(()),
        // handoff exits with clusterctl's code, as a move does.
        _ => Err(WindowError::Clusterctl {
            code: status.exit_code(),
            help: format!("{}: clusterctl move exited {}", c.label, status.describe()),
        }),
    }
}
