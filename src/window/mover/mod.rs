//! `handoff move`: `clusterctl move` as a child process, with both clusters' controllers
//! stopped around it in the order clusterctl needs, and a way back. What to do comes from
//! `move_plan`; the windows come from `open` and `close`.

mod child;
mod cluster_api;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::close::{CloseOptions, Restored, close};
use super::common::{Cluster, Result, WindowError, now, read_window, record};
use super::move_plan::{self, BLOCK_MOVE, ClusterSeen, ClusterctlFlags, PAUSED_ANNOTATION, Start};
use super::open::{OpenOptions, check, open, plan_open};
use crate::resources::move_window::{MoveRecord, Strategy, WindowState};
use child::{Child, ExitStatus, Signals};
use cluster_api::{CLUSTER_CLASSES, CLUSTERS, clusters_in, paused_in, scan};

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

/// Change the move's record on the target's window; nothing to record where there is no
/// window yet (an `--abort` of a move that never started).
async fn note(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    match record(c, window, |s| {
        f(s.move_record.get_or_insert_with(MoveRecord::default))
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

/// Remove handoff's block-move from every Cluster of `ns` that carries it (and only
/// handoff's): it must never be copied to the target or hold the next move.
async fn lift_block_move(
    source: &Cluster,
    target: &Cluster,
    window: &str,
    ns: &str,
) -> Result<Vec<String>> {
    let ours = move_plan::block_move_value(window);
    let mut lifted = Vec::new();
    for cl in clusters_in(source, ns).await? {
        if cl.block_move.as_deref() == Some(&ours)
            && cluster_api::patch(
                source,
                CLUSTERS,
                &cl.key,
                json!({"metadata": {"annotations": {BLOCK_MOVE: null}}}),
                "removing handoff's block-move from",
            )
            .await?
        {
            lifted.push(cl.key);
        }
    }
    note(target, window, |m| m.block_move.clear()).await?;
    Ok(lifted)
}

/// Unpause what clusterctl paused: Clusters (`spec.paused`) and ClusterClasses (the paused
/// annotation), as a re-run needs them.
async fn unpause(
    c: &Cluster,
    clusters: &[String],
    classes: &[String],
    out: &mut dyn Write,
) -> Result<()> {
    for key in clusters {
        cluster_api::patch(
            c,
            CLUSTERS,
            key,
            json!({"spec": {"paused": false}}),
            "unpausing",
        )
        .await?;
        let _ = writeln!(
            out,
            "{}: unpaused Cluster {key} (clusterctl paused it)",
            c.label
        );
    }
    for key in classes {
        cluster_api::patch(
            c,
            CLUSTER_CLASSES,
            key,
            json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}}),
            "unpausing",
        )
        .await?;
        let _ = writeln!(
            out,
            "{}: unpaused ClusterClass {key} (clusterctl paused it)",
            c.label
        );
    }
    Ok(())
}

/// On a re-run: unpause the source's Clusters and ClusterClasses that clusterctl paused in the
/// recorded attempt (clusterctl refuses to start while any is paused), and forget them.
async fn unpause_what_clusterctl_paused(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    r: &MoveRecord,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = &r.namespace;
    let clusters = move_plan::to_unpause(
        &r.paused_by_clusterctl,
        &r.clusters,
        &clusters_in(source, ns).await?,
    );
    let classes = move_plan::to_unpause(
        &[],
        &r.cluster_classes,
        &paused_in(source, ns, CLUSTER_CLASSES).await?,
    );
    unpause(source, &clusters, &classes, out).await?;
    note(target, &opts.window, |m| m.paused_by_clusterctl.clear()).await
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
    let mut start = move_plan::start(recorded.as_ref(), &ns).map_err(|m| refused(target, m))?;
    let r = recorded.clone().unwrap_or_default();
    if start == Start::Resume {
        // clusterctl deletes from the source only once it has created everything in the
        // target: an object marked or being deleted in the source, or one the target holds and
        // the source no longer does, says the deletes have begun.
        let (s, t) = (scan(source, &ns).await?, scan(target, &ns).await?);
        let deleting = !s.deleting.is_empty() || t.objects.iter().any(|o| !s.objects.contains(o));
        start = move_plan::resume(
            &r,
            &clusters_in(source, &ns).await?,
            &clusters_in(target, &ns).await?,
            deleting,
        );
    }
    let mut restored = Vec::new();
    match start {
        Start::RestoreOnly => {
            let _ = writeln!(
                out,
                "handoff move: clusterctl already moved namespace {ns}; restoring the controllers"
            );
            restore(source, target, opts, &mut restored, out).await?;
            return finish(target, opts, started, &restored, None, out).await;
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
                m.phase = "Restoring".into();
                m.clusterctl_exit = Some(0);
            })
            .await?;
            restore(source, target, opts, &mut restored, out).await?;
            return finish(target, opts, started, &restored, None, out).await;
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
    p.done(out, "checked");
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
        false => {
            move_plan::add_block_move(&clusters, &opts.window).map_err(|m| refused(source, m))?
        }
    };

    // 1. The target's controllers, before anything is copied.
    let p = phase(out, "stopping the target's controllers");
    open(std::slice::from_ref(target), &target_opts, out).await?;
    let target_stopped = Instant::now();
    let keys = |v: &[ClusterSeen]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
    let (cluster_keys, class_keys) = (keys(&clusters), keys(&classes));
    note(target, &opts.window, |m| {
        let mut at_start = m.clusters.clone();
        at_start.extend(cluster_keys.iter().cloned());
        at_start.sort();
        at_start.dedup();
        *m = MoveRecord {
            phase: "Stopping target".into(),
            namespace: ns.clone(),
            started_at: Some(now()),
            attempts: m.attempts + 1,
            clusters: at_start,
            cluster_classes: class_keys.clone(),
            ..MoveRecord::default()
        };
    })
    .await?;
    p.done(out, "the target's controllers are stopped");

    // From here on every way out lifts handoff's block-move and records why.
    let moved = async {
        // 2. handoff's block-move on each source Cluster, so that clusterctl's wait includes
        // handoff's: recorded before written, so a run that dies after the write still lifts it.
        note(target, &opts.window, |m| {
            m.phase = "Moving".into();
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
        let ran = run_clusterctl(source, target, &source_opts, opts, source_stopped_already, &mut signals, out).await?;
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
                m.phase = "Failed".into();
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
                m.phase = "Failed".into();
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
            "warning: clusterctl finished without waiting for handoff's block-move: the source's controllers were not stopped during the copy"
        );
    }
    note(target, &opts.window, |m| {
        m.phase = "Restoring".into();
        m.clusterctl_exit = Some(0);
        m.error = None;
    })
    .await?;
    // 4. Back: the target's first, then the source's.
    let (target_back, source_back) = restore(source, target, opts, &mut restored, out).await?;
    let durations = Some((
        target_back.duration_since(target_stopped),
        ran.source_stopped.map(|s| source_back.duration_since(s)),
    ));
    finish(target, opts, started, &restored, durations, out).await
}

/// Close the target's window (its controllers lead again), then the source's. Returns when
/// each was done.
async fn restore(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    restored: &mut Vec<Restored>,
    out: &mut dyn Write,
) -> Result<(Instant, Instant)> {
    let done = restore_each([target, source], opts, restored, out).await?;
    Ok((done[0], done[1]))
}

/// Close the window on each cluster in the order given (one that has none is skipped); when
/// each cluster's controllers ran again.
async fn restore_each(
    order: [&Cluster; 2],
    opts: &MoveOptions,
    restored: &mut Vec<Restored>,
    out: &mut dyn Write,
) -> Result<[Instant; 2]> {
    let mut done = [Instant::now(); 2];
    for (i, c) in order.into_iter().enumerate() {
        let p = phase(out, &format!("restoring the {}'s controllers", c.label));
        if read_window(c, &opts.window).await?.is_some() {
            restored.extend(close(std::slice::from_ref(c), &opts.close, out).await?);
        }
        p.done(out, &format!("the {}'s controllers run again", c.label));
        done[i] = Instant::now();
    }
    Ok(done)
}

async fn finish(
    target: &Cluster,
    opts: &MoveOptions,
    started: Instant,
    restored: &[Restored],
    stopped: Option<(Duration, Option<Duration>)>,
    out: &mut dyn Write,
) -> Result<()> {
    note(target, &opts.window, |m| m.phase = "Done".into()).await?;
    let _ = writeln!(
        out,
        "handoff move: namespace {} moved in {:.1}s",
        opts.flags.namespace,
        started.elapsed().as_secs_f64()
    );
    if let Some((t, s)) = stopped {
        let _ = writeln!(
            out,
            "  the target's controllers were stopped for {:.1}s, the source's for {}",
            t.as_secs_f64(),
            s.map(|s| format!("{:.1}s", s.as_secs_f64()))
                .unwrap_or_else(|| "no time (clusterctl did not wait)".into())
        );
    }
    for r in restored {
        let how = match (&r.leader, r.strategy) {
            (Some(pod), _) => format!("Lease released, {pod} leads"),
            (None, Strategy::Lease) => "Lease released".into(),
            (None, _) => format!("restored to {} replicas", r.replicas),
        };
        let _ = writeln!(
            out,
            "  {}: {} ({:?}): {how}{}",
            r.cluster,
            r.deployment,
            r.strategy,
            r.note
                .as_ref()
                .map(|n| format!(" — {n}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

fn render_args(f: &ClusterctlFlags) -> String {
    move_plan::clusterctl_args(f)
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

struct Ran {
    status: ExitStatus,
    interrupted: bool,
    /// When the source was proven stopped and handoff lifted its block-move.
    source_stopped: Option<Instant>,
}

/// Stop the source's controllers (proven), then record that clusterctl may copy. The lift of
/// handoff's block-move comes after, and only once this returned.
async fn stop_source(
    source: &Cluster,
    target: &Cluster,
    source_opts: &OpenOptions,
    window: &str,
    paused: &[String],
    out: &mut dyn Write,
) -> Result<()> {
    note(target, window, |m| {
        m.phase = "Stopping source".into();
        m.paused_by_clusterctl = paused.to_vec();
    })
    .await?;
    let p = phase(
        out,
        "clusterctl paused the source and the providers lifted their block-move: stopping the source's controllers",
    );
    open(std::slice::from_ref(source), source_opts, out).await?;
    p.done(out, "the source's controllers are stopped");
    note(target, window, |m| m.phase = "Copying".into()).await
}

/// Run clusterctl to its end. Meanwhile: once clusterctl has paused the source and the
/// providers have lifted their block-move, stop the source's controllers (proven), then lift
/// handoff's block-move so that clusterctl copies. SIGINT and SIGTERM go to clusterctl first,
/// also while the source is being stopped (then handoff's block-move stays until clusterctl
/// has stopped, so nothing is copied).
async fn run_clusterctl(
    source: &Cluster,
    target: &Cluster,
    source_opts: &OpenOptions,
    opts: &MoveOptions,
    stopped_already: bool,
    signals: &mut Signals,
    out: &mut dyn Write,
) -> Result<Ran> {
    let ns = &opts.flags.namespace;
    let mut child = Child::spawn(&opts.clusterctl, &opts.flags, source)?;
    let mut interrupted = false;
    let mut source_stopped = stopped_already.then(Instant::now);
    let mut last_wait = String::new();
    let mut tick = tokio::time::interval(opts.poll);
    let forward = |child: &Child, sig: i32, out: &mut dyn Write| {
        let name = if sig == libc::SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        };
        let _ = writeln!(
            out,
            "handoff move: interrupted; passing {name} to clusterctl and waiting for it to stop"
        );
        child.signal(sig);
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = signals.next() => {
                interrupted = true;
                forward(&child, sig, out);
            }
            _ = tick.tick(), if source_stopped.is_none() && !interrupted => {
                let read = async {
                    Ok::<_, WindowError>((clusters_in(source, ns).await?, scan(source, ns).await?.blocking))
                };
                let (clusters, blocking) = match read.await {
                    Ok(v) => v,
                    // A read that fails is retried at the next tick; clusterctl keeps waiting.
                    Err(e) => {
                        let _ = writeln!(out, "warning: {e}; trying again");
                        continue;
                    }
                };
                if let Err(waiting) = move_plan::source_ready(&clusters, &blocking, &opts.window) {
                    if waiting != last_wait {
                        let _ = writeln!(out, "handoff move: waiting for {waiting}");
                        last_wait = waiting;
                    }
                    continue;
                }
                let paused: Vec<String> = clusters.iter().filter(|c| c.paused).map(|c| c.key.clone()).collect();
                let stopped = tokio::select! {
                    r = stop_source(source, target, source_opts, &opts.window, &paused, out) => Some(r),
                    sig = signals.next() => {
                        interrupted = true;
                        child.signal(sig);
                        None
                    }
                };
                match stopped {
                    // Interrupted: clusterctl stops; handoff's block-move holds it meanwhile.
                    None => {
                        let _ = writeln!(out, "handoff move: interrupted while stopping the source; passed the signal to clusterctl, which copies nothing");
                    }
                    Some(Ok(())) => {
                        match lift_block_move(source, target, &opts.window, ns).await {
                            Ok(lifted) if !lifted.is_empty() => {
                                let _ = writeln!(out, "source: lifted handoff's {BLOCK_MOVE} from {}: clusterctl copies now", lifted.join(", "));
                            }
                            Ok(_) => {}
                            // clusterctl stays held until it gives up; the way out lifts again.
                            Err(e) => {
                                let _ = writeln!(out, "warning: {e}; clusterctl stays held by handoff's block-move");
                            }
                        }
                        source_stopped = Some(Instant::now());
                    }
                    // The source could not be stopped: clusterctl must not copy with its
                    // controllers running, and handoff's block-move still holds it.
                    Some(Err(e)) => {
                        let _ = writeln!(out, "handoff move: {e}; stopping clusterctl before it copies anything");
                        child.stop().await;
                        return Err(e);
                    }
                }
            }
        }
    };
    let status = status.map_err(|e| WindowError::Refused {
        cluster: source.label.clone(),
        message: format!("waiting for clusterctl: {e}"),
    })?;
    Ok(Ran {
        status,
        interrupted,
        source_stopped,
    })
}

/// `--dry-run`: clusterctl's own dry run, and handoff's plan for both clusters; nothing is
/// written.
async fn dry_run(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = &opts.flags.namespace;
    let _ = writeln!(
        out,
        "handoff move --dry-run: what handoff would do around clusterctl move (nothing is written)"
    );
    let _ = writeln!(out, "1. stop the target's controllers:");
    plan_open(std::slice::from_ref(target), &opts.open, out).await?;
    let clusters = clusters_in(source, ns).await?;
    match move_plan::add_block_move(&clusters, &opts.window) {
        Ok(add) => {
            let _ = writeln!(
                out,
                "2. put {BLOCK_MOVE} on Cluster {} in the source, and run clusterctl move",
                add.join(", ")
            );
        }
        Err(why) => {
            let _ = writeln!(out, "2. would refuse: {why}");
        }
    }
    let paused: Vec<&str> = clusters
        .iter()
        .filter(|c| c.paused)
        .map(|c| c.key.as_str())
        .collect();
    if !paused.is_empty() {
        let _ = writeln!(
            out,
            "   would refuse: Clusters paused already ({})",
            paused.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "3. once clusterctl has paused them and the providers lifted their block-move, stop the source's controllers:"
    );
    plan_open(std::slice::from_ref(source), &opts.open, out).await?;
    let _ = writeln!(
        out,
        "4. after clusterctl succeeds: restore the target's controllers, then the source's"
    );
    let _ = writeln!(
        out,
        "handoff move --dry-run: running {} {}",
        opts.clusterctl.display(),
        render_args(&opts.flags)
    );
    let mut child = Child::spawn(&opts.clusterctl, &opts.flags, source)?;
    let status = child.wait().await.map_err(|e| WindowError::Refused {
        cluster: source.label.clone(),
        message: format!("waiting for clusterctl: {e}"),
    })?;
    match status.code {
        Some(0) => Ok(()),
        _ => Err(WindowError::Clusterctl {
            code: status.exit_code(),
            help: format!("clusterctl move --dry-run exited {}", status.describe()),
        }),
    }
}

/// `--abort`: every controller back as it was, the source's first (it still owns what was not
/// moved), handoff's block-move lifted, and what clusterctl left behind reported. It acts on
/// the recorded move's namespace, whatever `--namespace` says.
async fn abort(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    recorded: Option<&MoveRecord>,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = recorded
        .map(|r| r.namespace.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| opts.flags.namespace.clone());
    let _ = writeln!(
        out,
        "handoff move --abort: {}",
        match recorded {
            Some(r) => format!(
                "the move of namespace {} recorded in MoveWindow {} (phase {})",
                r.namespace, opts.window, r.phase
            ),
            None => format!(
                "no move recorded in MoveWindow {}; restoring whatever it stopped",
                opts.window
            ),
        }
    );
    if ns != opts.flags.namespace {
        let _ = writeln!(
            out,
            "note: aborting the recorded move of namespace {ns}, not --namespace {}",
            opts.flags.namespace
        );
    }
    if recorded.is_some() {
        note(target, &opts.window, |m| m.phase = "Aborting".into()).await?;
    }
    let lifted = lift_block_move(source, target, &opts.window, &ns).await?;
    if !lifted.is_empty() {
        let _ = writeln!(
            out,
            "source: lifted handoff's {BLOCK_MOVE} from {}",
            lifted.join(", ")
        );
    }
    let mut restored = Vec::new();
    restore_each([source, target], opts, &mut restored, out).await?;
    if recorded.is_some() {
        note(target, &opts.window, |m| m.phase = "Aborted".into()).await?;
    }
    let paused: Vec<String> = clusters_in(source, &ns)
        .await?
        .into_iter()
        .filter(|c| c.paused)
        .map(|c| c.key)
        .collect();
    let copied: Vec<String> = clusters_in(target, &ns)
        .await?
        .into_iter()
        .map(|c| c.key)
        .collect();
    let _ = writeln!(
        out,
        "handoff move --abort: every controller handoff stopped runs again"
    );
    for c in [source, target] {
        let ds: Vec<String> = restored
            .iter()
            .filter(|r| r.cluster == c.label)
            .map(|r| format!("{} ({:?})", r.deployment, r.strategy))
            .collect();
        if !ds.is_empty() {
            let _ = writeln!(out, "  {}: {}", c.label, ds.join(", "));
        }
    }
    let list = |v: &[String]| match v.is_empty() {
        true => "none".to_string(),
        false => v.join(", "),
    };
    let _ = writeln!(out, "What clusterctl left behind, for you to decide:");
    let _ = writeln!(out, "  source Clusters still paused: {}", list(&paused));
    let _ = writeln!(
        out,
        "  Clusters in the target's namespace {ns}: {}",
        list(&copied)
    );
    if !paused.is_empty() {
        let _ = writeln!(
            out,
            "  unpause one to let the source reconcile it again: kubectl -n {ns} patch clusters.cluster.x-k8s.io NAME --type merge -p '{{\"spec\":{{\"paused\":false}}}}'"
        );
    }
    Ok(())
}
