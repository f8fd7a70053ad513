//! clusterctl's run inside `handoff move`: handoff's block-move holds clusterctl until the
//! source's controllers are proven stopped, then is lifted so that clusterctl copies; and
//! `--dry-run`, which runs clusterctl's own dry run beside handoff's plan.

use crate::window::progress::{Format, Progress};

use serde_json::json;
use tokio::time::Instant;

use super::cluster_api::{self, CLUSTER_CLASSES, CLUSTERS, classes_in, clusters_in, scan, scope};
use super::pause_watch::PauseWatch;
use super::{MoveOptions, Mover, note, phase};
use crate::resources::phase::MovePhase;
use crate::window::child::{Child, ExitStatus};
use crate::window::cluster::{Cluster, Result, WindowError};
use crate::window::open::{first_taken, plan_open, prove, take};
use crate::window::plan::move_next::Because;
use crate::window::plan::move_plan::{self, BLOCK_MOVE};
use std::ffi::OsString;

/// clusterctl run to its end with the controllers stopped (a backup's, a restore's, each
/// namespace's of a whole move), its output as a move's; `what` prefixes handoff's lines. How
/// it ended is the caller's planner's to judge.
pub async fn run_to_end(
    c: &Cluster,
    clusterctl: &std::path::Path,
    args: Vec<OsString>,
    what: &str,
    out: &mut Progress,
) -> Result<ExitStatus> {
    out.say(format!(
        "{what}: running {} {}",
        clusterctl.display(),
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let t = Instant::now();
    let refused = |message: String| WindowError::Refused {
        cluster: c.label.into(),
        message,
    };
    let mut child = Child::spawn(clusterctl, args, out.format() == Format::Json)
        .map_err(|e| refused(e.to_string()))?;
    let status = child
        .wait()
        .await
        .map_err(|e| refused(format!("waiting for clusterctl: {e}")))?;
    out.say(format!(
        "{what}: clusterctl exited {} ({:.1}s)",
        status.describe(),
        t.elapsed().as_secs_f64()
    ));
    Ok(status)
}

/// Remove handoff's block-move from every Cluster of `ns` that carries it (and only
/// handoff's): it must never be copied to the target or hold the next move.
pub async fn lift_block_move(
    source: &Cluster,
    target: &Cluster,
    window: &str,
    ns: &str,
) -> Result<Vec<String>> {
    let ours = move_plan::block_move_value(window);
    let mut lifted = Vec::new();
    // A namespace of ClusterClasses alone carries it on its classes.
    let classes = classes_in(source, ns, &[]).await?;
    let held = clusters_in(source, ns)
        .await?
        .into_iter()
        .map(|c| (CLUSTERS, "Cluster", c))
        .chain(
            classes
                .into_iter()
                .map(|c| (CLUSTER_CLASSES, "ClusterClass", c)),
        );
    for (crd, kind, o) in held {
        if o.block_move.as_deref() == Some(&ours)
            && cluster_api::patch(
                source,
                crd,
                &o.key,
                json!({"metadata": {"annotations": {BLOCK_MOVE: null}}}),
                "removing handoff's block-move from",
            )
            .await?
        {
            lifted.push(format!("{kind} {}", o.key));
        }
    }
    note(target, window, |m| m.block_move.clear()).await?;
    Ok(lifted)
}

/// clusterctl started with `args` (`move_plan::clusterctl_args`), said first.
fn spawn(
    opts: &MoveOptions,
    args: Vec<OsString>,
    source: &Cluster,
    out: &Progress,
) -> Result<Child> {
    let json = out.format() == Format::Json;
    Child::spawn(&opts.clusterctl, args, json).map_err(|e| WindowError::Refused {
        cluster: source.label.into(),
        message: e.to_string(),
    })
}

fn render_args(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

impl Mover<'_> {
    /// clusterctl started, its pause watched from before (`StartClusterctl`); the child goes
    /// to the runner (`Performer::started`), which waits on its end from now on.
    pub(super) async fn start_clusterctl(&mut self, watch_pause: bool, ns: &str) -> Result<()> {
        let opts = self.opts;
        let args = move_plan::clusterctl_args(&opts.flags);
        self.clusterctl_started = Some(phase(
            self.out,
            &format!(
                "running {} {}",
                opts.clusterctl.display(),
                render_args(&args)
            ),
        ));
        // Watched from before clusterctl starts, so that its pause is seen as it is written.
        self.pauses = match watch_pause {
            true => Some(PauseWatch::start(self.source, ns).await?),
            false => None,
        };
        let child = spawn(opts, args, self.source, self.out)?;
        self.clusterctl_pid = child.pid();
        self.clusterctl = Some(child);
        Ok(())
    }

    /// Until clusterctl has paused every source Cluster and the providers lifted their
    /// block-moves (`AwaitPause`): the paused Clusters.
    pub(super) async fn await_pause(&mut self, ns: &str) -> Result<Vec<String>> {
        let Some(pauses) = &self.pauses else {
            panic!("the move's planner: AwaitPause without StartClusterctl's watch");
        };
        // Reads the watch's view (no request); the objects' block-moves are listed at most
        // once a `poll`, and only once every Cluster is paused.
        let mut tick = tokio::time::interval(PAUSE_TICK.min(self.opts.poll));
        loop {
            tick.tick().await;
            if let Some(paused) = source_paused(
                self.source,
                pauses,
                ns,
                self.opts,
                &mut self.waited,
                self.out,
            )
            .await
            {
                return Ok(paused);
            }
        }
    }

    /// `Stopping source` recorded with what clusterctl paused, the source's controllers taken
    /// and when first recorded (`StopSource`); proven with the target's next.
    pub(super) async fn stop_source(&mut self, paused: &[String]) -> Result<()> {
        let (source, target, window) = (self.source, self.target, &self.opts.window);
        note(target, window, |m| {
            m.phase = MovePhase::StoppingSource;
            m.paused_by_clusterctl = paused.to_vec();
        })
        .await?;
        let p = phase(
            self.out,
            "clusterctl paused the source and the providers lifted their block-move: stopping the source's controllers",
        );
        let source_taken = take(std::slice::from_ref(source), &self.source_opts, self.out).await?;
        let first = first_taken(&source_taken);
        note(target, window, |m| {
            m.source_stopped_at.get_or_insert_with(|| first.clone());
        })
        .await?;
        self.taken.extend(source_taken);
        p.done(self.out, "the source's controllers are taken");
        Ok(())
    }

    /// Both clusters' controllers proven stopped together (the later of the two bounds, each
    /// Lease still the window's, each Lease-stopped controller serving), then `Copying`
    /// recorded: clusterctl may copy once the block-move is lifted, and only after this
    /// (`ProveStopped`).
    pub(super) async fn prove_stopped(&mut self) -> Result<()> {
        let taken = std::mem::take(&mut self.taken);
        let p = phase(self.out, "proving both clusters' controllers stopped");
        prove(&taken, self.out).await?;
        p.done(
            self.out,
            "both clusters' controllers are proven stopped, and serve their webhooks",
        );
        note(self.target, &self.opts.window, |m| {
            m.phase = MovePhase::Copying
        })
        .await
    }

    /// Pass `signal` on to clusterctl, saying why (`SignalClusterctl`).
    pub(super) fn signal_clusterctl(&mut self, signal: i32, because: &Because) {
        match because {
            Because::Interrupted { copying } => {
                let name = if signal == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                };
                let held = match copying {
                    true => "",
                    false => " (it copies nothing: handoff's block-move holds it)",
                };
                self.out.say(format!("handoff move: interrupted; passing {name} to clusterctl and waiting for it to stop{held}"));
            }
            Because::Stopped(why) => {
                self.out.say(format!(
                    "handoff move: {why}; stopping clusterctl before it copies anything"
                ));
            }
        }
        if let Some(pid) = self.clusterctl_pid {
            // SAFETY: kill(2) on our own child's pid, with a plain signal number. The runner
            // reaps it only by waiting on it, and a step is performed before that wait is
            // polled again: the pid is still clusterctl's (at worst a zombie's).
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// How clusterctl ended (`ClusterctlExited`).
    pub(super) fn clusterctl_exited(&mut self, status: &ExitStatus, unheld: bool) {
        self.clusterctl_pid = None;
        self.pauses = None;
        let said = format!("clusterctl exited {}", status.describe());
        match self.clusterctl_started.take() {
            Some(p) => p.done(self.out, &said),
            None => self.out.say(format!("handoff move: {said}")),
        }
        if unheld {
            self.out.warn("clusterctl finished without waiting for handoff's block-move (does this clusterctl honour clusterctl.cluster.x-k8s.io/block-move?): neither cluster's controllers were proven stopped before the copy");
        }
    }
}

/// How often the watched Clusters are looked at while clusterctl runs (in memory).
const PAUSE_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// What `source_paused` said last, and when it last listed the objects' block-moves.
#[derive(Default)]
pub(super) struct Waited {
    said: Option<move_plan::Waiting>,
    scanned: Option<Instant>,
    /// When the Clusters were last listed, where the watch failed.
    listed: Option<Instant>,
}

/// The source's Clusters in scope, once clusterctl has paused every one and the providers have
/// lifted their block-moves; `None` while it waits (said once per change) or a read failed
/// (retried later; clusterctl keeps waiting).
async fn source_paused(
    source: &Cluster,
    pauses: &PauseWatch,
    ns: &str,
    opts: &MoveOptions,
    waited: &mut Waited,
    out: &mut Progress,
) -> Option<Vec<String>> {
    let clusters = match pauses.failed() {
        None => pauses.clusters()?,
        // Listed at most once a poll instead, as before the watch.
        Some(why) => {
            if waited.listed.is_some_and(|t| t.elapsed() < opts.poll) {
                return None;
            }
            if waited.listed.is_none() {
                out.warn(format!(
                    "watching the source's Clusters failed ({why}); listing them each {:?} instead",
                    opts.poll
                ));
            }
            waited.listed = Some(Instant::now());
            match clusters_in(source, ns).await {
                Ok(c) => c,
                Err(e) => {
                    out.warn(format!("{e}; trying again"));
                    return None;
                }
            }
        }
    };
    // The other objects only once every Cluster is paused: before that the answer is "wait".
    let blocking = match move_plan::source_ready(&clusters, &[], &opts.window) {
        Err(w @ move_plan::Waiting::Pause(_)) => Err(w),
        _ if waited.scanned.is_some_and(|t| t.elapsed() < opts.poll) => return None,
        _ => {
            waited.scanned = Some(Instant::now());
            match scan(source, ns).await {
                Ok(s) => Ok(s.blocking),
                Err(e) => {
                    out.warn(format!("{e}; trying again"));
                    return None;
                }
            }
        }
    };
    let ready = blocking.and_then(|b| move_plan::source_ready(&clusters, &b, &opts.window));
    if let Err(w) = ready {
        if waited.said.as_ref() != Some(&w) {
            out.say(format!("handoff move: waiting for {w}"));
            waited.said = Some(w);
        }
        return None;
    }
    Some(
        clusters
            .iter()
            .filter(|c| c.paused)
            .map(|c| c.key.clone())
            .collect(),
    )
}

/// `--dry-run`: clusterctl's own dry run, and handoff's plan for both clusters; nothing is
/// written.
pub async fn dry_run(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    out: &mut Progress,
) -> Result<()> {
    let ns = &opts.flags.namespace;
    out.say(
        "handoff move --dry-run: what handoff would do around clusterctl move (nothing is written)",
    );
    out.say("1. stop the target's controllers (proven while clusterctl starts and waits):");
    let target_wait = plan_open(std::slice::from_ref(target), &opts.open, out).await?;
    let scope = scope(source, ns, &[], true).await?;
    let args = move_plan::clusterctl_args(&opts.flags);
    let would = move_plan::dry_run(
        ns,
        &opts.window,
        &scope.clusters,
        &scope.classes,
        &scope.class_users,
    );
    match &would.held {
        Ok(add) => {
            out.say(format!(
                "2. put {BLOCK_MOVE} on {} in the source, and run clusterctl move",
                add.describe()
            ));
        }
        Err(why) => {
            out.say(format!("2. would refuse: {why}"));
        }
    }
    if let Some(why) = &would.paused {
        out.say(format!("   would refuse: {why}"));
    }
    if !would.behind.is_empty() {
        out.say(format!(
            "   clusterctl copies ClusterClass {} to the target and leaves it in the source, where Clusters outside namespace {ns} use it (it pauses it there and unpauses only the copy); handoff unpauses it in the source once the move is over",
            would.behind.join(", ")
        ));
    }
    out.say("3. once clusterctl has paused them and the providers lifted their block-move, stop the source's controllers:");
    let source_wait = plan_open(std::slice::from_ref(source), &opts.open, out).await?;
    let (expected, at_latest) = (
        target_wait.expected.max(source_wait.expected),
        target_wait.at_latest.max(source_wait.at_latest),
    );
    out.say(format!("   then lift handoff's {BLOCK_MOVE} once both clusters are proven stopped: expected within {expected}s of the source's stop (each former leader's proof above), {at_latest}s at the latest (the Leases' longest former lease duration, target {}s, source {}s); clusterctl notices at its next block-move check (at once, then 5 s × 1.5ⁿ after its first)",
        target_wait.at_latest, source_wait.at_latest));
    out.say("4. after clusterctl succeeds: restore the target's controllers, then the source's");
    out.say(format!(
        "handoff move --dry-run: running {} {}",
        opts.clusterctl.display(),
        render_args(&args)
    ));
    let mut child = spawn(opts, args, source, out)?;
    let status = child.wait().await.map_err(|e| WindowError::Refused {
        cluster: source.label.into(),
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
