//! A backup's and a restore's one next step, pure, for the runner: where the run starts is
//! `directory_plan::start`'s (from the window, its record and the namespace's Clusters as read
//! before the first step); from there each step follows from what the run reached, and a
//! failure from a backup's pause on puts it back before it is recorded. The performer
//! (`mover/directory.rs`) decides nothing.

use crate::resources::phase::MovePhase;
use crate::window::plan::declare::{Of, steps};
use crate::window::plan::directory_plan::{Direction, DirectoryRefusal, Start, Then};
use crate::window::plan::move_next::Seen;
use crate::window::plan::move_plan::{self, ClusterSeen};
use crate::window::plan::planner::{ExitStatus, Observation, Planner, Verdict};

steps! {
/// One step of a backup or a restore, with what it acts on, in the order of
/// `docs/src/tasks/move.md`'s lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirStep names DirectoryStep {
    /// What the run needs checked before it writes: that the cluster's controllers can be
    /// stopped, clusterctl's version, nothing paused by somebody else; nothing written.
    Check,
    /// The run recorded in the cluster (its window created), before anything else is
    /// written: a run that dies after it is put back by the same command or `--abort`.
    Record { clusters: Vec<String> },
    /// A backup: every Cluster and ClusterClass of the namespace paused (which ran recorded
    /// first), so that the providers lift their block-move while they still run.
    Pause { clusters: Vec<String> },
    /// A backup: until nothing of the namespace carries a provider's block-move.
    WaitUnblocked,
    /// The cluster's controllers stopped and proven stopped; a backup's records `Copying` and
    /// when its source was stopped after (`copying`).
    Stop { copying: bool },
    /// A backup: what it paused unpaused, so that the backup holds the Clusters as they ran.
    Unpause { clusters: Vec<String> },
    /// clusterctl's backup (`--to-directory`) or restore (`--from-directory`); a restore's
    /// records `Copying` and when its target was stopped first (`copying`), its last error
    /// cleared.
    RunClusterctl { copying: bool },
    /// A backup: the controllers back and what it paused unpaused; on a re-run or an
    /// `--abort`, what an earlier run left.
    PutBack {
        unpause: Vec<String>,
        /// The window closed, after this phase is recorded.
        close: Option<MovePhase>,
        /// The backup recorded done.
        done: bool,
    },
    /// A restore: the controllers back, once clusterctl restored everything.
    Restore,
    /// Record why clusterctl failed, and end with it.
    Fail(Failure),
    /// Stop, writing nothing more, and say why.
    Refuse(DirectoryRefusal),
    /// An `--abort`: the run recorded undone.
    Aborted { recorded: bool },
    /// Remove what the window brought along where nothing of handoff was installed.
    Uninstall,
    /// Nothing left to do.
    Done,
}
}

/// Why a run failed, as recorded and said: clusterctl's exit code where it was clusterctl.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub what: String,
    pub exit: Option<i32>,
}

/// What a step found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Nothing,
    /// clusterctl ended, and what to say of it where it failed.
    Exited {
        status: ExitStatus,
        what: String,
    },
}

/// How a run ended, once the planner ended it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Ended {
    #[default]
    No,
    Done,
    Aborted,
    Refused(DirectoryRefusal),
    Failed(Failure),
}

/// Where a run is, in order for each way it goes; a step not taken is skipped over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum DirAt {
    #[default]
    Begun,
    PutBackFirst,
    Checked,
    Recorded,
    Paused,
    Unblocked,
    Stopped,
    Unpaused,
    /// clusterctl ran, or a backup's step from the pause on failed: put back next.
    Ran,
    PutBack,
    Restored,
    /// Refused, aborted or failed: what the window brought removed next.
    Ending,
    Uninstalled,
}

/// What this run has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirReached {
    pub at: DirAt,
    pub failure: Option<Failure>,
    pub ended: Ended,
}

/// What a step needs read: after a backup's clusterctl (or its failure), the Clusters and the
/// window as they are then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirRead {
    pub clusters: Seen<Vec<ClusterSeen>>,
    pub open: Seen<bool>,
}

/// A backup's or a restore's planner: what the user asked, and where the run starts.
pub struct DirectoryPlanner {
    pub direction: Direction,
    pub start: Start,
    /// The window recorded a run before this one.
    pub recorded: bool,
    /// A backup's Clusters as they ran when it began (the ones it pauses).
    pub clusters: Vec<String>,
}

impl DirectoryPlanner {
    fn backup(&self) -> bool {
        matches!(self.direction, Direction::Backup { .. })
    }

    /// Whether the next step needs the Clusters and the window read.
    pub fn reads(&self, r: &DirReached) -> bool {
        self.backup() && r.at == DirAt::Ran
    }

    /// A failure that is recorded (and, for a backup, put back first) rather than the run's
    /// end: a backup's from its pause on, and clusterctl's.
    fn recorded_failure(&self, step: &DirStep) -> bool {
        match step {
            DirStep::RunClusterctl { .. } => true,
            DirStep::Pause { .. }
            | DirStep::WaitUnblocked
            | DirStep::Stop { .. }
            | DirStep::Unpause { .. } => self.backup(),
            _ => false,
        }
    }
}

impl Planner for DirectoryPlanner {
    type Step = DirStep;
    type Name = DirectoryStep;
    type Read = DirRead;
    type Reached = DirReached;
    type Found = Found;

    fn of(&self) -> Of {
        self.direction.of()
    }

    fn name(step: &DirStep) -> DirectoryStep {
        step.name()
    }

    fn next(&self, read: &DirRead, r: &DirReached) -> DirStep {
        let s = &self.start;
        let backup = self.backup();
        match r.at {
            DirAt::Begun if !s.unpause.is_empty() || s.close => DirStep::PutBack {
                unpause: s.unpause.clone(),
                close: s.close.then_some(MovePhase::Aborting),
                done: false,
            },
            DirAt::Begun | DirAt::PutBackFirst => match &s.then {
                Then::Refuse(why) => DirStep::Refuse(why.clone()),
                Then::Aborted => DirStep::Aborted {
                    recorded: self.recorded,
                },
                // A restore whose controllers a run before this one stopped: clusterctl again.
                Then::Run {
                    stopped_already: true,
                } => DirStep::RunClusterctl { copying: !backup },
                Then::Run { .. } => DirStep::Check,
            },
            DirAt::Checked => DirStep::Record {
                clusters: self.clusters.clone(),
            },
            DirAt::Recorded if backup => DirStep::Pause {
                clusters: self.clusters.clone(),
            },
            DirAt::Recorded => DirStep::Stop { copying: false },
            DirAt::Paused => DirStep::WaitUnblocked,
            DirAt::Unblocked => DirStep::Stop { copying: true },
            DirAt::Stopped if backup => DirStep::Unpause {
                clusters: self.clusters.clone(),
            },
            DirAt::Stopped | DirAt::Unpaused => DirStep::RunClusterctl { copying: !backup },
            // clusterctl unpauses at its end; a run that stopped before may have left them
            // paused.
            DirAt::Ran if backup => DirStep::PutBack {
                unpause: move_plan::to_unpause(
                    &[],
                    &self.clusters,
                    read.clusters
                        .get("the namespace's Clusters after clusterctl"),
                ),
                close: read
                    .open
                    .get("whether the window is open after clusterctl")
                    .then_some(MovePhase::Restoring),
                done: r.failure.is_none(),
            },
            DirAt::Ran | DirAt::PutBack => match &r.failure {
                Some(f) => DirStep::Fail(f.clone()),
                None if backup => DirStep::Uninstall,
                None => DirStep::Restore,
            },
            DirAt::Restored | DirAt::Ending => DirStep::Uninstall,
            DirAt::Uninstalled => DirStep::Done,
        }
    }

    fn observe(&self, r: &mut DirReached, step: &DirStep, o: Observation<'_, Found>) -> Verdict {
        let found = match o {
            Observation::Done(found) => found,
            Observation::Failed(e) if self.recorded_failure(step) => {
                r.failure = Some(Failure {
                    what: e.to_string(),
                    exit: None,
                });
                r.at = DirAt::Ran;
                return Verdict::GoOn;
            }
            // Before the run wrote what a put-back undoes, or while it puts back: the error is
            // the run's end, and the same command picks it up.
            Observation::Failed(_) => return Verdict::End,
            // No step of a backup or a restore may be cut (`cuttable`).
            Observation::Cut(_) => return Verdict::GoOn,
        };
        r.at = match step {
            DirStep::PutBack { .. } if r.at == DirAt::Begun => DirAt::PutBackFirst,
            DirStep::PutBack { .. } => DirAt::PutBack,
            DirStep::Check => DirAt::Checked,
            DirStep::Record { .. } => DirAt::Recorded,
            DirStep::Pause { .. } => DirAt::Paused,
            DirStep::WaitUnblocked => DirAt::Unblocked,
            DirStep::Stop { .. } => DirAt::Stopped,
            DirStep::Unpause { .. } => DirAt::Unpaused,
            DirStep::RunClusterctl { .. } => {
                if let Found::Exited { status, what } = found
                    && status.code != Some(0)
                {
                    r.failure = Some(Failure {
                        what,
                        exit: Some(status.exit_code()),
                    });
                }
                DirAt::Ran
            }
            DirStep::Restore => DirAt::Restored,
            DirStep::Refuse(why) => {
                r.ended = Ended::Refused(why.clone());
                DirAt::Ending
            }
            DirStep::Aborted { .. } => {
                r.ended = Ended::Aborted;
                DirAt::Ending
            }
            DirStep::Fail(f) => {
                r.ended = Ended::Failed(f.clone());
                // A restore that failed keeps its controllers stopped and its window: the
                // same command finishes it, `--abort` undoes the stop.
                if !self.backup() {
                    return Verdict::End;
                }
                DirAt::Ending
            }
            DirStep::Uninstall if r.ended != Ended::No => return Verdict::End,
            DirStep::Uninstall => DirAt::Uninstalled,
            DirStep::Done => {
                r.ended = Ended::Done;
                return Verdict::End;
            }
        };
        Verdict::GoOn
    }
}

#[cfg(test)]
mod tests;
