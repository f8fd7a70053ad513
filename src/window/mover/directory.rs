//! `handoff move --to-directory` and `--from-directory`: clusterctl's backup and restore as a
//! child process, with the one cluster's controllers stopped around it (`directory_plan`
//! decides; this file reads, writes and runs).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::cluster_api::{CLUSTERS, clusters_in, patch, scan};
use crate::resources::move_window::MoveRecord;
use crate::resources::phase::MovePhase;
use crate::window::close::{CloseOptions, close, say_removed};
use crate::window::cluster::{Cluster, Result, WindowError, now, read_window, record};
use crate::window::open::{OpenOptions, check, open, window_at_least_closed};
use crate::window::plan::directory_next::{
    DirReached, DirRead, DirStep, DirectoryPlanner, Ended, Failure, Found,
};
use crate::window::plan::directory_plan::{self, Direction, DirectoryFlags, Then};
use crate::window::plan::move_next::Seen;
use crate::window::plan::move_plan::ClusterSeen;
use crate::window::progress::Progress;
use crate::window::runner::{self, Performer, Publish};
use crate::window::user_agent::StepLabel;

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
}

/// One backup or restore, from start to end, or its `--abort`; a run that died is put back
/// (a backup) or resumed (a restore) by the same command.
pub async fn run(c: &Cluster, o: &DirectoryOptions, out: &mut Progress) -> Result<()> {
    let what = o.flags.direction.of().as_str();
    let window = read_window(c, &o.window).await?;
    let is_open = window.as_ref().is_some_and(|w| w.spec.is_open());
    let rec = window
        .as_ref()
        .and_then(|w| w.status.as_ref())
        .and_then(|s| s.move_record.clone());
    let ns = match &o.flags.direction {
        Direction::Backup { namespaces } => Some(namespaces.clone()),
        Direction::Restore { .. } => None,
    };
    let clusters = match &ns {
        Some(ns) => clusters_of(c, ns).await?,
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
    let planner = DirectoryPlanner {
        direction: o.flags.direction.clone(),
        start,
        recorded: rec.is_some(),
        clusters: clusters.iter().map(|k| k.key.clone()).collect(),
    };
    let mut x = DirectoryRun {
        c,
        o,
        ns,
        quiet: OpenOptions {
            quiet_preflight: true,
            ..o.open.clone()
        },
        started: Instant::now(),
        out,
    };
    let reached = runner::run(&planner, &mut x, Publish::Top(&o.step_label)).await?;
    match reached.ended {
        Ended::Refused(why) => Err(WindowError::DirectoryRefused {
            cluster: c.label,
            why,
        }),
        // handoff exits with clusterctl's code, as a move does.
        Ended::Failed(Failure {
            what,
            exit: Some(code),
        }) => Err(WindowError::Clusterctl { code, help: what }),
        Ended::Failed(Failure { what, exit: None }) => Err(WindowError::Failed(what)),
        Ended::Done | Ended::Aborted | Ended::No => Ok(()),
    }
}

/// A backup's or a restore's I/O, for the runner.
struct DirectoryRun<'a, 'o> {
    c: &'a Cluster,
    o: &'a DirectoryOptions,
    /// A backup's namespaces.
    ns: Option<Vec<String>>,
    /// How the window is opened once its checks were said.
    quiet: OpenOptions,
    started: Instant,
    out: &'o mut Progress,
}

impl Performer<DirectoryPlanner> for DirectoryRun<'_, '_> {
    type Error = WindowError;

    async fn read(&mut self, p: &DirectoryPlanner, r: &DirReached) -> Result<DirRead> {
        if !p.reads(r) {
            return Ok(DirRead::default());
        }
        let ns = self.ns.as_deref().unwrap_or_default();
        Ok(DirRead {
            clusters: Seen::Read(clusters_of(self.c, ns).await?),
            open: Seen::Read(
                read_window(self.c, &self.o.window)
                    .await?
                    .is_some_and(|w| w.spec.is_open()),
            ),
        })
    }

    async fn perform(&mut self, step: &DirStep, _: &DirRead) -> Result<Found> {
        let (c, o) = (self.c, self.o);
        match step {
            DirStep::Check => check(std::slice::from_ref(c), &o.open, self.out).await?,
            DirStep::Record { clusters } => self.record(clusters).await?,
            DirStep::Pause { clusters } => self.pause_all(clusters, true).await?,
            DirStep::WaitUnblocked => {
                let ns = self.ns.as_deref().unwrap_or_default();
                wait_unblocked(c, o, ns, self.out).await?
            }
            DirStep::Stop { copying } => {
                open(std::slice::from_ref(c), &self.quiet, self.out).await?;
                if *copying {
                    note(c, &o.window, |m| {
                        m.phase = MovePhase::Copying;
                        m.source_stopped_at.get_or_insert_with(now);
                    })
                    .await?;
                }
            }
            DirStep::Unpause { clusters } => self.pause_all(clusters, false).await?,
            DirStep::RunClusterctl { copying } => {
                if *copying {
                    note(c, &o.window, |m| {
                        m.phase = MovePhase::Copying;
                        m.target_stopped_at.get_or_insert_with(now);
                        m.error = None;
                    })
                    .await?;
                }
                return clusterctl(c, o, self.out).await;
            }
            DirStep::PutBack {
                unpause,
                close,
                done,
            } => self.put_back(unpause, close.as_ref(), *done).await?,
            DirStep::Restore => self.restore().await?,
            DirStep::Fail(f) => self.fail(f).await?,
            DirStep::Refuse(_) => {}
            DirStep::Aborted { recorded } => self.aborted(*recorded).await?,
            DirStep::Uninstall => say_removed(c, &o.window, self.out).await?,
            DirStep::Done => self.out.say(format!(
                "handoff move: {} done in {:.1}s ({})",
                o.flags.direction.of().as_str(),
                self.started.elapsed().as_secs_f64(),
                o.flags.directory.display()
            )),
        }
        Ok(Found::Nothing)
    }

    fn progress(&mut self) -> &mut Progress {
        self.out
    }
}

impl DirectoryRun<'_, '_> {
    /// Pause the Clusters (so that the providers finish and lift their block-move) or unpause
    /// them again (clusterctl refuses a paused Cluster, and pauses it itself).
    async fn pause_all(&mut self, clusters: &[String], paused: bool) -> Result<()> {
        let c = self.c;
        for key in clusters {
            set_paused(c, key, paused).await?;
        }
        if clusters.is_empty() {
            return Ok(());
        }
        let list = clusters.join(", ");
        self.out.say(match paused {
            true => format!(
                "{}: paused Cluster {list}, so that the providers finish what they are doing and lift their block-move (a backup alone does not wait for it)",
                c.label
            ),
            false => format!(
                "{}: unpaused Cluster {list} again (nothing reconciles it now; clusterctl refuses a paused Cluster, and pauses it itself)",
                c.label
            ),
        });
        Ok(())
    }

    /// A backup's way back: what it paused unpaused, the window closed where it was opened,
    /// recorded done where the backup was.
    async fn put_back(
        &mut self,
        unpause: &[String],
        closing: Option<&MovePhase>,
        done: bool,
    ) -> Result<()> {
        let (c, o) = (self.c, self.o);
        for key in unpause {
            set_paused(c, key, false).await?;
            self.out.say(format!("{}: unpaused Cluster {key}", c.label));
        }
        if let Some(phase) = closing {
            set_phase(c, &o.window, phase.clone()).await?;
            close(std::slice::from_ref(c), &o.closing(), self.out).await?;
        }
        if done {
            note(c, &o.window, |m| {
                m.phase = MovePhase::Done;
                m.source_back_at.get_or_insert_with(now);
            })
            .await?;
        }
        Ok(())
    }

    /// A restore's end: the controllers run again, recorded first as restoring, then done.
    async fn restore(&mut self) -> Result<()> {
        let (c, o) = (self.c, self.o);
        note(c, &o.window, |m| m.phase = MovePhase::Restoring).await?;
        close(std::slice::from_ref(c), &o.closing(), self.out).await?;
        note(c, &o.window, |m| {
            m.phase = MovePhase::Done;
            m.target_back_at.get_or_insert_with(now);
        })
        .await
    }

    async fn aborted(&mut self, recorded: bool) -> Result<()> {
        if recorded {
            set_phase(self.c, &self.o.window, MovePhase::Aborted).await?;
        }
        self.out.say(match self.ns.is_some() {
            true => "handoff move --abort: the controllers and the Clusters are back as they were",
            false => "handoff move --abort: the controllers are back; what clusterctl restored stays as it is (its Clusters paused where clusterctl stopped before unpausing them): kubectl --kubeconfig … get clusters.cluster.x-k8s.io -A -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,PAUSED:.spec.paused",
        });
        Ok(())
    }

    /// The window and its record before the first write that a put-back undoes.
    async fn record(&mut self, clusters: &[String]) -> Result<()> {
        let (c, o) = (self.c, self.o);
        let read = read_window(c, &o.window).await?;
        window_at_least_closed(c, &self.quiet, read).await?;
        let (phase, namespace) = match &self.ns {
            Some(ns) => (MovePhase::StoppingSource, ns.join(", ")),
            None => (MovePhase::StoppingTarget, String::new()),
        };
        record(c, &o.window, |s| {
            let attempts = s.move_record.as_ref().map_or(0, |m| m.attempts);
            s.move_record = Some(MoveRecord {
                phase: phase.clone(),
                namespace: namespace.clone(),
                started_at: Some(now()),
                attempts: attempts + 1,
                clusters: clusters.to_vec(),
                ..MoveRecord::default()
            });
        })
        .await
        .map(|_| ())
    }

    /// Why the run failed, recorded; and what is left said.
    async fn fail(&mut self, f: &Failure) -> Result<()> {
        note(self.c, &self.o.window, |m| {
            m.phase = MovePhase::Failed;
            m.clusterctl_exit = f.exit;
            m.error = Some(f.what.clone());
        })
        .await?;
        match self.ns.is_some() {
            true => self.out.say("The controllers and the Clusters are back as they were; whatever clusterctl wrote to the folder is incomplete. Run the same command again."),
            false => self.out.say(format!(
                "The controllers handoff stopped stay stopped, and MoveWindow {} stays open: they would reconcile a half-restored management cluster. Two ways on:\n  finish the restore: the same command again (clusterctl creates what is missing and skips what is there)\n  undo the stop:      the same command with --abort (the controllers come back; what was restored stays)",
                self.o.window
            )),
        }
        Ok(())
    }
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

/// Set one Cluster's `spec.paused` (a merge patch, retried while a provider's webhook blinks).
async fn set_paused(c: &Cluster, key: &str, paused: bool) -> Result<()> {
    let what = if paused { "pausing" } else { "unpausing" };
    patch(c, CLUSTERS, key, json!({"spec": {"paused": paused}}), what)
        .await
        .map(|_| ())
}

/// The Clusters of every namespace backed up.
async fn clusters_of(c: &Cluster, namespaces: &[String]) -> Result<Vec<ClusterSeen>> {
    let mut all = Vec::new();
    for ns in namespaces {
        all.extend(clusters_in(c, ns).await?);
    }
    Ok(all)
}

/// Wait until every Cluster is paused and no object of the namespaces holds a block-move.
async fn wait_unblocked(
    c: &Cluster,
    o: &DirectoryOptions,
    namespaces: &[String],
    out: &mut Progress,
) -> Result<()> {
    let deadline = Instant::now() + o.open.wait_timeout;
    let mut said = None;
    loop {
        let clusters = clusters_of(c, namespaces).await?;
        let mut blocking = Vec::new();
        for ns in namespaces {
            blocking.extend(scan(c, ns).await?.blocking);
        }
        let why = match directory_plan::backup_ready(&clusters, &blocking) {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(WindowError::Refused {
                cluster: c.label.into(),
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

/// clusterctl, with the controllers stopped, once per namespace with `-A` (a backup's folders
/// made first: clusterctl writes only into one that exists); its output as a move's. How it
/// ended is what it found, the first failure ending it: the planner's to record.
async fn clusterctl(c: &Cluster, o: &DirectoryOptions, out: &mut Progress) -> Result<Found> {
    let backup = matches!(o.flags.direction, Direction::Backup { .. });
    let mut last = None;
    for run in directory_plan::clusterctl_runs(&o.flags) {
        let what = match &run.namespace {
            Some(ns) => format!("handoff move: namespace {ns}"),
            None => "handoff move".to_string(),
        };
        if backup && run.namespace.is_some() {
            std::fs::create_dir_all(&run.folder).map_err(|e| WindowError::Refused {
                cluster: c.label.into(),
                message: format!("making the folder {}: {e}", run.folder.display()),
            })?;
        }
        let status = super::clusterctl::run_to_end(c, &o.clusterctl, run.args, &what, out).await?;
        let failed = status.code != Some(0);
        let what = format!(
            "{}: clusterctl move{} exited {}",
            c.label,
            run.namespace
                .map(|ns| format!(" (namespace {ns})"))
                .unwrap_or_default(),
            status.describe()
        );
        last = Some(Found::Exited { status, what });
        if failed {
            break;
        }
    }
    Ok(last.unwrap_or(Found::Nothing))
}
