//! `handoff move`: `clusterctl move` as a child process, with both clusters' controllers
//! stopped around it in the order clusterctl needs, and a way back. What to do comes from
//! `move_plan`; the windows come from `open` and `close`. This file is the move itself,
//! phase by phase; `clusterctl` runs it, `restore` is the way back.

mod child;
mod cluster_api;
mod clusterctl;
mod restore;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::close::{CloseOptions, close};
use super::common::{Cluster, Result, WindowError, now, read_window, record};
use super::move_plan::{self, BLOCK_MOVE, ClusterSeen, ClusterctlFlags, PAUSED_ANNOTATION, Start};
use super::open::{OpenOptions, Taken, check, first_taken, open, prove, ready_standbys, take};
use crate::resources::move_window::{MoveRecord, WindowState};
use crate::resources::phase::MovePhase;
use child::Signals;
use cluster_api::{CLUSTER_CLASSES, CLUSTERS, clusters_in, paused_in, scan, secrets_in};
use clusterctl::{SourceStop, dry_run, lift_block_move, render_args, run_clusterctl};
use restore::{abort, finish, restore, unpause, unpause_what_clusterctl_paused};

#[derive(Debug, Clone)]
pub struct MoveOptions {
    pub window: String,
    pub flags: ClusterctlFlags,
    pub clusterctl: PathBuf,
    pub abort: bool,
    /// How each cluster's window is opened (its name is `window`).
    pub open: OpenOptions,
    pub close: CloseOptions,
    /// How often the source is read while clusterctl waits.
    pub poll: Duration,
}

async fn read_record(c: &Cluster, window: &str) -> Result<Option<MoveRecord>> {
    Ok(read_window(c, window)
        .await?
        .and_then(|w| w.status)
        .and_then(|s| s.move_record))
}

/// Change the move's record on the target's window, where there is one: an `--abort` of a
/// move that died before it recorded anything must leave none (a record of no namespace would
/// refuse the next move).
async fn note(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    write_record(c, window, false, f).await
}

/// Begin the move's record (or a re-run's, over the one there).
async fn begin(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    write_record(c, window, true, f).await
}

/// Nothing to record where there is no window yet (an `--abort` of a move that never started).
async fn write_record(
    c: &Cluster,
    window: &str,
    create: bool,
    f: impl Fn(&mut MoveRecord),
) -> Result<()> {
    match record(c, window, |s| match (&mut s.move_record, create) {
        (Some(m), _) => f(m),
        (r @ None, true) => f(r.get_or_insert_with(MoveRecord::default)),
        (None, false) => {}
    })
    .await
    {
        Err(WindowError::Api {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 404 => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Where an unfinished move resumes, from what the clusters hold now. clusterctl deletes from
/// the source only once it has created everything in the target: an object marked or being
/// deleted in the source, or one the target holds and the source no longer does, says the
/// deletes have begun.
async fn resumed(
    source: &Cluster,
    target: &Cluster,
    r: &MoveRecord,
    out: &mut dyn Write,
) -> Result<Start> {
    let ns = &r.namespace;
    let (mut s, mut t) = (scan(source, ns).await?, scan(target, ns).await?);
    match (secrets_in(source, ns).await?, secrets_in(target, ns).await?) {
        (Some(ss), Some(ts)) => {
            s.objects.extend(ss.objects);
            s.deleting.extend(ss.deleting);
            t.objects.extend(ts.objects);
        }
        _ => {
            let _ = writeln!(
                out,
                "warning: cannot list the Secrets of namespace {ns} (forbidden), so whether clusterctl had begun deleting them from the source is judged by its other objects alone; clusterctl itself needs them: run handoff move as the user who runs clusterctl move"
            );
        }
    }
    let deleting = !s.deleting.is_empty() || t.objects.iter().any(|o| !s.objects.contains(o));
    Ok(move_plan::resume(
        r,
        &clusters_in(source, ns).await?,
        &clusters_in(target, ns).await?,
        deleting,
    ))
}

/// A phase: its name on a line, its duration when it ends.
struct Phase {
    started: Instant,
}

fn phase(out: &mut dyn Write, what: &str) -> Phase {
    let _ = writeln!(out, "handoff move: {what}");
    Phase {
        started: Instant::now(),
    }
}

impl Phase {
    fn done(self, out: &mut dyn Write, what: &str) {
        let _ = writeln!(
            out,
            "handoff move: {what} ({:.1}s)",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Run the whole move, or resume it, or abort it.
pub async fn run(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    out: &mut dyn Write,
) -> Result<()> {
    let started = Instant::now();
    if opts.flags.dry_run {
        return dry_run(source, target, opts, out).await;
    }
    let recorded = read_record(target, &opts.window).await?;
    if opts.abort {
        return abort(source, target, opts, recorded.as_ref(), out).await;
    }
    let ns = opts.flags.namespace.clone();
    let refused = |c: &Cluster, message: String| WindowError::Refused {
        cluster: c.label.clone(),
        message,
    };
    let mut start = move_plan::start(recorded.as_ref(), &opts.window, &ns)
        .map_err(|e| refused(target, e.to_string()))?;
    let r = recorded.clone().unwrap_or_default();
    if start == Start::Resume {
        start = resumed(source, target, &r, out).await?;
    }
    let fresh = start == Start::Fresh;
    let mut restored = Vec::new();
    match start {
        Start::RestoreOnly => {
            let _ = writeln!(
                out,
                "handoff move: clusterctl already moved namespace {ns}; restoring the controllers"
            );
            restore(source, target, opts, &mut restored, out).await?;
            return finish(target, opts, started, &restored, out).await;
        }
        Start::FinishTarget => {
            let _ = writeln!(
                out,
                "handoff move: every Cluster of namespace {ns} is in the target and gone from the source; unpausing the target's, as clusterctl's last step would, then restoring the controllers"
            );
            let paused: Vec<String> = clusters_in(target, &ns)
                .await?
                .into_iter()
                .filter(|c| c.paused && r.clusters.contains(&c.key))
                .map(|c| c.key)
                .collect();
            unpause(target, &paused, &[], out).await?;
            note(target, &opts.window, |m| {
                m.phase = MovePhase::Restoring;
                m.clusterctl_exit = Some(0);
            })
            .await?;
            restore(source, target, opts, &mut restored, out).await?;
            return finish(target, opts, started, &restored, out).await;
        }
        _ => {}
    }

    // Before anything is written: both clusters' stops must be possible.
    let p = phase(
        out,
        "checking how each controller would be stopped, in both clusters",
    );
    let mut target_opts = opts.open.clone();
    target_opts
        .reason
        .get_or_insert_with(|| format!("handoff move of namespace {ns}: target"));
    let mut source_opts = opts.open.clone();
    source_opts
        .reason
        .get_or_insert_with(|| format!("handoff move of namespace {ns}: source"));
    check(std::slice::from_ref(target), &target_opts, out).await?;
    check(std::slice::from_ref(source), &source_opts, out).await?;
    // Its block-move wait is all that holds clusterctl's copy until both clusters are proven
    // stopped.
    match move_plan::block_move_honoured(&child::version(&opts.clusterctl, source).await?) {
        Ok(()) => {}
        Err(e @ move_plan::ClusterctlVersion::TooOld(_)) => {
            return Err(refused(source, e.to_string()));
        }
        Err(e) => {
            let _ = writeln!(out, "warning: {e}");
        }
    }
    p.done(out, "checked");
    // Said once: the opens below check again, quietly.
    target_opts.quiet_preflight = true;
    source_opts.quiet_preflight = true;
    let mut signals = Signals::catch()
        .map_err(|e| refused(source, format!("cannot catch SIGINT and SIGTERM: {e}")))?;

    let source_stopped_already = start == Start::ResumeStopped;
    match start {
        Start::Resume => {
            let p = phase(
                out,
                &format!(
                    "resuming the move recorded in MoveWindow {} on the target (phase {}, attempt {}): putting the source back as clusterctl expects it",
                    opts.window, r.phase, r.attempts
                ),
            );
            // Providers lift their block-move only while their controllers run.
            if read_window(source, &opts.window)
                .await?
                .is_some_and(|w| w.spec.state == WindowState::Open)
            {
                close(std::slice::from_ref(source), &opts.close, out).await?;
            }
            // It runs again: its stop counts anew.
            note(target, &opts.window, |m| m.source_stopped_at = None).await?;
            unpause_what_clusterctl_paused(source, target, opts, &r, out).await?;
            p.done(out, "the source runs again, the target stays stopped");
        }
        Start::ResumeStopped => {
            let p = phase(
                out,
                &format!(
                    "resuming the move recorded in MoveWindow {} (phase {}, attempt {}): clusterctl had begun deleting from the source, so the source's controllers stay stopped (they would re-create what was deleted) and clusterctl finishes the copy and the deletes",
                    opts.window, r.phase, r.attempts
                ),
            );
            open(std::slice::from_ref(source), &source_opts, out).await?;
            note(target, &opts.window, |m| {
                m.source_stopped_at.get_or_insert_with(now);
            })
            .await?;
            // Nothing reconciles them: every source controller is stopped.
            unpause_what_clusterctl_paused(source, target, opts, &r, out).await?;
            p.done(
                out,
                "the source stays stopped, its Clusters unpaused for clusterctl",
            );
        }
        _ => {}
    }
    let clusters = clusters_in(source, &ns).await?;
    let classes = paused_in(source, &ns, CLUSTER_CLASSES).await?;
    let paused: Vec<String> = clusters
        .iter()
        .chain(&classes)
        .filter(|c| c.paused)
        .map(|c| c.key.clone())
        .collect();
    if !paused.is_empty() {
        return Err(refused(
            source,
            format!(
                "these are paused, and clusterctl move refuses to start while any Cluster or ClusterClass is (since v1.12): {}; unpause them (kubectl -n {ns} patch clusters.cluster.x-k8s.io NAME --type merge -p '{{\"spec\":{{\"paused\":false}}}}'; a ClusterClass: remove its {PAUSED_ANNOTATION} annotation) or move without them",
                paused.join(", ")
            ),
        ));
    }
    // Where the source is stopped already, nothing needs holding; else every Cluster gets
    // handoff's block-move, or the move does not start.
    let add = match source_stopped_already {
        true => vec![],
        false => move_plan::add_block_move(&clusters, &opts.window)
            .map_err(|e| refused(source, e.to_string()))?,
    };

    // 1. The target's controllers: taken now, proven stopped before anything is created
    // there. The proof (the former leaders' lease duration) runs while clusterctl starts,
    // pauses the source and waits on handoff's block-move, and ends together with the
    // source's, right before the lift: one Lease bound per move, not two in a row.
    let p = phase(out, "stopping the target's controllers");
    let target_taken = take(std::slice::from_ref(target), &target_opts, out).await?;
    let first = first_taken(&target_taken);
    let proven_at = target_taken
        .iter()
        .map(Taken::proven_at)
        .max()
        .map(|t| t.to_string());
    let keys = |v: &[ClusterSeen]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
    let (cluster_keys, class_keys) = (keys(&clusters), keys(&classes));
    begin(target, &opts.window, |m| {
        let mut at_start = m.clusters.clone();
        at_start.extend(cluster_keys.iter().cloned());
        at_start.sort();
        at_start.dedup();
        // Kept across re-runs: the stop counts from the first take-over.
        let (t, s) = match fresh {
            true => (None, None),
            false => (m.target_stopped_at.take(), m.source_stopped_at.take()),
        };
        *m = MoveRecord {
            phase: MovePhase::StoppingTarget,
            namespace: ns.clone(),
            started_at: Some(now()),
            attempts: m.attempts + 1,
            clusters: at_start,
            cluster_classes: class_keys.clone(),
            target_stopped_at: t.or_else(|| Some(first.clone())),
            source_stopped_at: s,
            ..MoveRecord::default()
        };
    })
    .await?;
    // Where the source is stopped already there is no block-move to hold clusterctl: the
    // target is proven before clusterctl starts.
    let target_taken = match source_stopped_already {
        true => {
            prove(&target_taken, out).await?;
            p.done(out, "the target's controllers are stopped");
            vec![]
        }
        false => {
            p.done(
                out,
                &format!(
                    "the target's controllers are held; proven stopped at {}, while clusterctl starts and waits",
                    proven_at.as_deref().unwrap_or("once taken")
                ),
            );
            target_taken
        }
    };

    // From here on every way out lifts handoff's block-move and records why.
    let moved = async {
        // The source's standbys now, while its controllers run: its stop, once clusterctl
        // has paused it, then only takes the Leases.
        if !source_stopped_already {
            ready_standbys(source, &source_opts, out).await?;
        }
        // 2. handoff's block-move on each source Cluster, so that clusterctl's wait includes
        // handoff's: recorded before written, so a run that dies after the write still lifts it.
        note(target, &opts.window, |m| {
            m.phase = MovePhase::Moving;
            m.block_move = add.clone();
        })
        .await?;
        for key in &add {
            cluster_api::patch(
                source,
                CLUSTERS,
                key,
                json!({"metadata": {"annotations": {BLOCK_MOVE: move_plan::block_move_value(&opts.window)}}}),
                "putting handoff's block-move on",
            )
            .await?;
        }
        if !add.is_empty() {
            let _ = writeln!(
                out,
                "source: {BLOCK_MOVE} on Cluster {} until the source's controllers are stopped",
                add.join(", ")
            );
        }
        if let Some(sig) = signals.caught() {
            return Err(refused(source, format!("interrupted (signal {sig}) before clusterctl started")));
        }
        // 3. clusterctl, while the source's controllers still run.
        let p = phase(
            out,
            &format!("running {} {}", opts.clusterctl.display(), render_args(&opts.flags)),
        );
        let stop = match source_stopped_already {
            true => SourceStop::Already,
            false => SourceStop::AfterPause { opts: &source_opts, target: target_taken },
        };
        let ran = run_clusterctl(source, target, stop, opts, &mut signals, out).await?;
        p.done(out, &format!("clusterctl exited {}", ran.status.describe()));
        Ok(ran)
    }
    .await;
    signals.release();
    // Never leave handoff's block-move behind, whatever happened.
    let lifted = lift_block_move(source, target, &opts.window, &ns).await;
    if let Err(e) = &lifted {
        let _ = writeln!(
            out,
            "warning: {e}; run the same command again to lift handoff's {BLOCK_MOVE}"
        );
    }
    let ran = match moved {
        Ok(ran) if ran.status.code == Some(0) => ran,
        Ok(ran) => {
            let what = format!(
                "clusterctl move exited {}{}",
                ran.status.describe(),
                if ran.interrupted {
                    " (handoff was interrupted and passed the signal on)"
                } else {
                    ""
                }
            );
            let code = ran.status.exit_code();
            note(target, &opts.window, |m| {
                m.phase = MovePhase::Failed;
                m.clusterctl_exit = Some(ran.status.code.unwrap_or(-1));
                m.error = Some(what.clone());
            })
            .await?;
            return Err(WindowError::Clusterctl {
                code,
                help: move_plan::failure_help(&opts.flags, &opts.window, &opts.clusterctl, &what),
            });
        }
        Err(e) => {
            let what = format!("handoff move stopped: {e}");
            let _ = note(target, &opts.window, |m| {
                m.phase = MovePhase::Failed;
                m.error = Some(what.clone());
            })
            .await;
            return Err(WindowError::Clusterctl {
                code: 1,
                help: move_plan::failure_help(&opts.flags, &opts.window, &opts.clusterctl, &what),
            });
        }
    };
    if ran.source_stopped.is_none() {
        let _ = writeln!(
            out,
            "warning: clusterctl finished without waiting for handoff's block-move (does this clusterctl honour clusterctl.cluster.x-k8s.io/block-move?): neither cluster's controllers were proven stopped before the copy"
        );
    }
    note(target, &opts.window, |m| {
        m.phase = MovePhase::Restoring;
        m.clusterctl_exit = Some(0);
        m.error = None;
    })
    .await?;
    // 4. Back: the target's first, then the source's.
    restore(source, target, opts, &mut restored, out).await?;
    finish(target, opts, started, &restored, out).await
}
