//! Each step of `handoff move` performed, one function each: what `move_next::next` chose,
//! done and said. None of them decides what comes next.

use serde_json::json;

use super::cluster_api::{
    self, CLUSTER_CLASSES, CLUSTERS, DELETE_FOR_MOVE, classes_in, clusters_in,
    unmark_delete_for_move,
};
use super::clusterctl::lift_block_move;
use super::restore::{report_abort, report_done, restore_one, unpause, unpause_saying};
use super::{Mover, begin, note, phase};
use crate::resources::move_window::{MoveRecord, MoveRole};
use crate::resources::phase::MovePhase;
use crate::window::close::{close, say_removed};
use crate::window::cluster::{Result, WindowError, now};
use crate::window::open::{Taken, check, first_taken, open, prove, ready_standbys, take};
use crate::window::plan::move_next::{Begun, Found, Lifting, Observed, Outcome, Step};
use crate::window::plan::move_plan::{self, BLOCK_MOVE, BlockMoveOn, Holds, Paused, Start};

impl Mover<'_> {
    /// Perform `step` on namespace `ns` (`Reads::namespace`); clusterctl's outcome, where it
    /// ran. What to do is the step's: nothing here looks at how the run began.
    pub(super) async fn perform(
        &mut self,
        step: &Step,
        r: Option<&MoveRecord>,
        seen: &Observed,
        ns: &str,
    ) -> Result<Found> {
        match step {
            Step::Begin(b) => self.begin_run(b, r),
            Step::Refuse { cluster, why } => Err(WindowError::MoveRefused {
                cluster: self.cluster(*cluster).label,
                why: why.clone(),
            }),
            Step::Check { warn } => self.check(warn.as_ref()).await,
            Step::PutSourceBack {
                close_window,
                unpause,
            } => {
                self.put_source_back(self.recorded(r)?, *close_window, unpause)
                    .await
            }
            Step::KeepSourceStopped { unpause } => {
                self.keep_source_stopped(self.recorded(r)?, ns, unpause)
                    .await
            }
            Step::StopTarget {
                block_move: _,
                standbys_first,
                keep_stop_times,
            } => {
                self.stop_target(seen, ns, *standbys_first, *keep_stop_times)
                    .await
            }
            Step::ProveTarget => self.prove_target().await,
            Step::Hold { block_move } => self.hold(block_move).await,
            Step::StartClusterctl { watch_pause } => self.start_clusterctl(*watch_pause, ns).await,
            Step::AwaitPause => {
                return self.await_pause(ns).await.map(Found::SourcePaused);
            }
            Step::StopSource { paused } => self.stop_source(paused).await,
            Step::ProveStopped => self.prove_stopped().await,
            // Its end comes to the runner, which cuts this wait.
            Step::AwaitClusterctl => std::future::pending().await,
            Step::SignalClusterctl { signal, because } => {
                self.signal_clusterctl(*signal, because);
                Ok(())
            }
            Step::ClusterctlExited { status, unheld } => {
                self.clusterctl_exited(status, *unheld);
                Ok(())
            }
            Step::Lift(why) => self.lift(*why, ns).await,
            Step::Fail(why) => self.fail(why).await,
            Step::UnpauseTarget(keys) => unpause(self.target, keys, &[], self.out).await,
            Step::UnpauseSource(keys) => self.unpause_source(keys).await,
            Step::Copied => self.copied().await,
            Step::RestoreTarget => self.restore(MoveRole::Target, true).await,
            Step::RestoreSource { wait_leading } => {
                self.restore(MoveRole::Source, *wait_leading).await
            }
            Step::Finish => self.finish(ns).await,
            Step::BeginAbort => {
                let aborting = |m: &mut MoveRecord| m.phase = MovePhase::Aborting;
                note(self.target, &self.opts.window, aborting).await
            }
            Step::Aborted { recorded } => self.aborted(*recorded, ns).await,
            Step::Uninstall => self.uninstall().await,
            Step::Done => Ok(()),
        }
        .map(|()| Found::Nothing)
    }

    async fn unpause_source(&mut self, classes: &[String]) -> Result<()> {
        let why = "clusterctl paused it and left it in the source, where Clusters of other namespaces use it";
        unpause_saying(self.source, &[], classes, why, self.out).await
    }

    async fn finish(&mut self, ns: &str) -> Result<()> {
        let (target, started) = (self.target, self.started);
        report_done(target, ns, self.opts, started, &self.restored, self.out).await
    }

    /// The source's first: the target's window holds the record until the last.
    async fn uninstall(&mut self) -> Result<()> {
        for c in [self.source, self.target] {
            say_removed(c, &self.opts.window, self.out).await?;
        }
        Ok(())
    }

    /// The record a step acts on, which the run began from.
    fn recorded<'r>(&self, r: Option<&'r MoveRecord>) -> Result<&'r MoveRecord> {
        // The planner refuses a resume without it; said the same way if it goes meanwhile.
        r.ok_or_else(|| WindowError::MoveRefused {
            cluster: self.target.label,
            why: move_plan::Refusal::RecordGone(self.opts.window.clone()),
        })
    }

    /// One cluster's controllers back, waiting for their leaders where `lead` (the step's).
    async fn restore(&mut self, role: MoveRole, lead: bool) -> Result<()> {
        let c = self.cluster(role).clone();
        let (target, opts) = (self.target, self.opts);
        restore_one(&c, target, opts, lead, &mut self.restored, self.out).await
    }

    fn begin_run(&mut self, b: &Begun, r: Option<&MoveRecord>) -> Result<()> {
        let (start, ns, window) = (&b.start, &b.namespace, &self.opts.window);
        if *start == Start::Tidy {
            self.out.say(format!("handoff move: namespace {ns} was moved already (MoveWindow {window} records it done, and its Clusters are in the target only): nothing to {}; removing what the move brought along, if anything is left",
                if self.opts.abort { "abort" } else { "move" }));
            return Ok(());
        }
        if self.opts.abort {
            match r {
                Some(r) => {
                    self.out.say(format!("handoff move --abort: the move of namespace {} recorded in MoveWindow {window} (phase {})",
                    r.namespace, r.phase));
                }
                None => {
                    self.out.say(format!("handoff move --abort: no move recorded in MoveWindow {window}; restoring whatever it stopped"));
                }
            }
            if *ns != self.opts.flags.namespace {
                self.out.say(format!(
                    "note: aborting the recorded move of namespace {ns}, not --namespace {}",
                    self.opts.flags.namespace
                ));
            }
            return Ok(());
        }
        match start {
            Start::RestoreOnly => {
                self.out.say(format!("handoff move: clusterctl already moved namespace {ns}; restoring the controllers"));
            }
            Start::FinishTarget => {
                self.out.say(format!("handoff move: every Cluster of namespace {ns} is in the target and gone from the source; unpausing the target's, as clusterctl's last step would, then restoring the controllers"));
            }
            Start::Tidy => {}
            Start::Fresh | Start::Resume | Start::ResumeStopped => {}
        }
        Ok(())
    }

    /// Before anything is written: both clusters' stops must be possible. What the planner
    /// could not tell of clusterctl's version is said here, once.
    async fn check(&mut self, warn: Option<&move_plan::ClusterctlVersion>) -> Result<()> {
        if let Some(w) = warn {
            self.out.warn(w);
        }
        let p = phase(
            self.out,
            "checking how each controller would be stopped, in both clusters",
        );
        check(
            std::slice::from_ref(self.target),
            &self.target_opts,
            self.out,
        )
        .await?;
        check(
            std::slice::from_ref(self.source),
            &self.source_opts,
            self.out,
        )
        .await?;
        p.done(self.out, "checked");
        // Said once: the opens after this check again, quietly.
        self.target_opts.quiet_preflight = true;
        self.source_opts.quiet_preflight = true;
        Ok(())
    }

    /// A resumed move that deleted nothing: the source runs again (providers lift their
    /// block-move only while their controllers run), unpaused as clusterctl expects it.
    async fn put_source_back(
        &mut self,
        r: &MoveRecord,
        close_window: bool,
        paused: &Paused,
    ) -> Result<()> {
        let window = &self.opts.window;
        let p = phase(
            self.out,
            &format!(
                "resuming the move recorded in MoveWindow {window} on the target (phase {}, attempt {}): putting the source back as clusterctl expects it",
                r.phase, r.attempts
            ),
        );
        if close_window {
            close(
                std::slice::from_ref(self.source),
                &self.opts.close,
                self.out,
            )
            .await?;
        }
        // It runs again: its stop counts anew.
        note(self.target, window, |m| m.source_stopped_at = None).await?;
        self.unpause_for_clusterctl(paused).await?;
        p.done(self.out, "the source runs again, the target stays stopped");
        Ok(())
    }

    /// A resumed move after clusterctl began deleting: the source's controllers stay stopped
    /// (they would re-create what was deleted); its Clusters are unpaused, since nothing
    /// reconciles them, so that clusterctl starts and finishes the copy and the deletes.
    async fn keep_source_stopped(
        &mut self,
        r: &MoveRecord,
        ns: &str,
        paused: &Paused,
    ) -> Result<()> {
        let window = &self.opts.window;
        let p = phase(
            self.out,
            &format!(
                "resuming the move recorded in MoveWindow {window} (phase {}, attempt {}): clusterctl had begun deleting from the source, so the source's controllers stay stopped (they would re-create what was deleted) and clusterctl finishes the copy and the deletes",
                r.phase, r.attempts
            ),
        );
        open(
            std::slice::from_ref(self.source),
            &self.source_opts,
            self.out,
        )
        .await?;
        note(self.target, window, |m| {
            m.source_stopped_at.get_or_insert_with(now);
        })
        .await?;
        let (unmarked, secrets_read) = unmark_delete_for_move(self.source, ns).await?;
        if !secrets_read {
            self.out.warn(format!(
                "cannot list the Secrets of namespace {ns} (forbidden), so a Secret clusterctl marked {DELETE_FOR_MOVE} and did not delete keeps the mark, and so does its copy in the target; run handoff move as the user who runs clusterctl move"
            ));
        }
        if !unmarked.is_empty() {
            self.out.say(format!(
                "source: removed {DELETE_FOR_MOVE} from {} (clusterctl marked them and died before deleting them; it would copy the mark to the target, and marks each again right before it deletes it)",
                unmarked.join(", ")
            ));
        }
        self.unpause_for_clusterctl(paused).await?;
        p.done(
            self.out,
            "the source stays stopped, its Clusters unpaused for clusterctl",
        );
        Ok(())
    }

    /// What clusterctl paused in the recorded attempt, unpaused (it refuses to start while any
    /// is), and forgotten.
    async fn unpause_for_clusterctl(&mut self, paused: &Paused) -> Result<()> {
        unpause(self.source, &paused.clusters, &paused.classes, self.out).await?;
        note(self.target, &self.opts.window, |m| {
            m.paused_by_clusterctl.clear()
        })
        .await
    }

    /// The target's controllers, taken now and proven stopped before anything is created
    /// there. The proof (each former leader's end as the kubelet reports it, or its Lease's
    /// bound) runs while clusterctl starts, pauses the source and waits on handoff's
    /// block-move, and is checked with the source's, right before the lift.
    async fn stop_target(
        &mut self,
        seen: &Observed,
        ns: &str,
        standbys_first: bool,
        keep_stop_times: bool,
    ) -> Result<()> {
        let p = phase(self.out, "stopping the target's controllers");
        // The source's standbys first, so that they come up while the target's do, and are
        // Ready by the time clusterctl has paused the source: the source's take-over then
        // waits for none, and handoff lifts its block-move before clusterctl's second check
        // (5 s after its first).
        if standbys_first {
            ready_standbys(self.source, &self.source_opts, self.out).await?;
        }
        let taken = take(
            std::slice::from_ref(self.target),
            &self.target_opts,
            self.out,
        )
        .await?;
        let first = first_taken(&taken);
        let keys =
            |v: &[move_plan::ClusterSeen]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
        let (cluster_keys, class_keys) = (keys(seen.source()), keys(seen.classes()));
        let elsewhere = move_plan::classes_left_behind(ns, seen.classes(), seen.class_users());
        if !elsewhere.is_empty() {
            self.out.say(format!(
                "source: ClusterClass {} stays in the source for Clusters outside namespace {ns} (clusterctl pauses it, copies it and leaves it there); handoff unpauses it there once the move is over",
                elsewhere.join(", "),
            ));
        }
        begin(self.target, &self.opts.window, |m| {
            let merged = |before: &[String], now: &[String]| {
                let mut v = before.to_vec();
                v.extend(now.iter().cloned());
                v.sort();
                v.dedup();
                v
            };
            let at_start = merged(&m.clusters, &cluster_keys);
            let classes = merged(&m.cluster_classes, &class_keys);
            // Kept across re-runs: the stop counts from the first take-over.
            let (t, s) = match keep_stop_times {
                false => (None, None),
                true => (m.target_stopped_at.take(), m.source_stopped_at.take()),
            };
            *m = MoveRecord {
                phase: MovePhase::StoppingTarget,
                namespace: ns.to_string(),
                started_at: Some(now()),
                attempts: m.attempts + 1,
                clusters: at_start,
                cluster_classes: classes,
                target_stopped_at: t.or_else(|| Some(first.clone())),
                source_stopped_at: s,
                ..MoveRecord::default()
            };
        })
        .await?;
        let proven_at = taken.iter().map(Taken::bound).max();
        let done = match (standbys_first, proven_at) {
            (false, _) => "the target's controllers are held; proven next, before clusterctl starts".to_string(),
            (true, Some(at)) => format!("the target's controllers are held; proven stopped by {at} at the latest, while clusterctl starts and waits"),
            (true, None) => "the target's controllers are held; proven stopped once taken, while clusterctl starts and waits".to_string(),
        };
        p.done(self.out, &done);
        self.taken = taken;
        Ok(())
    }

    /// Where the source is stopped already, no block-move holds clusterctl: the target is
    /// proven before clusterctl starts.
    async fn prove_target(&mut self) -> Result<()> {
        let p = phase(self.out, "proving the target's controllers stopped");
        let taken = std::mem::take(&mut self.taken);
        prove(&taken, self.out).await?;
        p.done(self.out, "the target's controllers are stopped");
        Ok(())
    }

    /// handoff's block-move on each source Cluster (or ClusterClass, in a namespace of them
    /// alone), so that clusterctl's wait includes handoff's: recorded before written, so a
    /// run that dies after the write still lifts it.
    async fn hold(&mut self, add: &BlockMoveOn) -> Result<()> {
        note(self.target, &self.opts.window, |m| {
            m.phase = MovePhase::Moving;
            m.block_move = add.keys.clone();
        })
        .await?;
        let value = move_plan::block_move_value(&self.opts.window);
        let crd = match add.holds {
            Holds::Clusters => CLUSTERS,
            Holds::ClusterClasses => CLUSTER_CLASSES,
        };
        for key in &add.keys {
            cluster_api::patch(
                self.source,
                crd,
                key,
                json!({"metadata": {"annotations": {BLOCK_MOVE: value}}}),
                "putting handoff's block-move on",
            )
            .await?;
        }
        if !add.keys.is_empty() {
            self.out.say(format!(
                "source: {BLOCK_MOVE} on {} until the source's controllers are stopped",
                add.describe()
            ));
        }
        Ok(())
    }

    /// handoff's block-move off every source Cluster: it must never be copied to the target
    /// or hold the next move. From here on a signal ends handoff (what is left is recorded).
    async fn lift(&mut self, why: Lifting, ns: &str) -> Result<()> {
        let lifted = lift_block_move(self.source, self.target, &self.opts.window, ns).await;
        match (lifted, why) {
            (Ok(lifted), _) if lifted.is_empty() => {}
            (Ok(lifted), _) => self.out.say(format!(
                "source: lifted handoff's {BLOCK_MOVE} from {}{}",
                lifted.join(", "),
                match why {
                    Lifting::Copy => ": clusterctl copies now",
                    Lifting::WayOut | Lifting::Abort => "",
                }
            )),
            (Err(e), Lifting::Copy) => self.out.warn(format!(
                "{e}; clusterctl stays held by handoff's block-move"
            )),
            (Err(e), Lifting::WayOut) => self.out.warn(format!(
                "{e}; run the same command again to lift handoff's {BLOCK_MOVE}"
            )),
            (Err(e), Lifting::Abort) => return Err(e),
        }
        Ok(())
    }

    /// Record why clusterctl's part failed, and end with what is left and the ways on.
    async fn fail(&mut self, outcome: &Outcome) -> Result<()> {
        let (window, opts) = (&self.opts.window, self.opts);
        let help =
            |what: &str| move_plan::failure_help(&opts.flags, window, &opts.clusterctl, what);
        match outcome {
            Outcome::Exited { exit, what } => {
                note(self.target, window, |m| {
                    m.phase = MovePhase::Failed;
                    m.clusterctl_exit = Some(*exit);
                    m.error = Some(what.clone());
                })
                .await?;
                // handoff exits with clusterctl's code, or 1 where it had none.
                Err(WindowError::Clusterctl {
                    code: (*exit).max(1),
                    help: help(what),
                })
            }
            Outcome::Stopped(what) => {
                let _ = note(self.target, window, |m| {
                    m.phase = MovePhase::Failed;
                    m.error = Some(what.clone());
                })
                .await;
                Err(WindowError::Clusterctl {
                    code: 1,
                    help: help(what),
                })
            }
            Outcome::Moved => Ok(()),
        }
    }

    /// clusterctl moved everything: recorded before the restore, so a re-run only restores.
    async fn copied(&mut self) -> Result<()> {
        note(self.target, &self.opts.window, |m| {
            m.phase = MovePhase::Restoring;
            m.clusterctl_exit = Some(0);
            m.error = None;
        })
        .await
    }

    /// An `--abort` done: recorded where a move was, and what clusterctl left behind said.
    async fn aborted(&mut self, recorded: bool, ns: &str) -> Result<()> {
        if recorded {
            note(self.target, &self.opts.window, |m| {
                m.phase = MovePhase::Aborted
            })
            .await?;
        }
        let paused: Vec<String> = clusters_in(self.source, ns)
            .await?
            .into_iter()
            .filter(|c| c.paused)
            .map(|c| c.key)
            .collect();
        let paused_classes: Vec<String> = classes_in(self.source, ns, &[])
            .await?
            .into_iter()
            .filter(|c| c.paused)
            .map(|c| c.key)
            .collect();
        let copied: Vec<String> = clusters_in(self.target, ns)
            .await?
            .into_iter()
            .map(|c| c.key)
            .collect();
        report_abort(
            [self.source, self.target],
            ns,
            &self.restored,
            &paused,
            &paused_classes,
            &copied,
            self.out,
        );
        Ok(())
    }
}
