//! A whole management cluster's move (`handoff move --all-namespaces`): its one next step,
//! pure (the performer is `mover/whole.rs`).
//!
//! One stop of both clusters for every namespace. clusterctl moves one namespace a run and
//! waits out each provider's block-move before it copies (`waitReadyForMove`, about six
//! minutes), and a provider lifts its block-move only while its controllers run, once it sees
//! its Cluster paused. So the order is the backup's (`directory_plan`), across every namespace
//! and both clusters: the namespaces and what handoff will pause are recorded first; every
//! Cluster and ClusterClass is paused; the providers lift their block-moves; both clusters are
//! stopped and proven stopped; what handoff paused is unpaused (clusterctl refuses a paused
//! Cluster) and nothing reconciles it now; clusterctl moves each namespace in
//! `all_namespaces::order`, each recorded `Copying` before it runs and `Moved` after, with the
//! ClusterClasses it paused and left in the source unpaused between runs (the next namespace's
//! run would refuse them); then the target's controllers come back, then the source's.
//!
//! A run that stops anywhere is finished by the same command from what the record says: before
//! the stop it pauses again (a pause is idempotent) and goes on; from the stop on it takes and
//! proves both clusters again, unpauses what is paused of the recorded Clusters, and runs
//! clusterctl for the namespace in flight, then the rest. An `--abort` puts every controller
//! back and unpauses the source; the namespaces already moved stay in the target, each whole
//! in one cluster, and it is refused once clusterctl began deleting the namespace in flight
//! (only the same command can finish that one).

use crate::resources::phase::MovePhase;
use crate::window::plan::all_namespaces::AllRefusal;
use crate::window::plan::declare::Of;
use crate::window::plan::move_next::Seen;
use crate::window::plan::move_plan::{self, ClusterSeen, ClusterctlVersion, Paused};
use crate::window::plan::planner::{ExitStatus, Observation, Planner, Verdict};

/// Where one namespace of a whole move is, as the target's record keeps it.
pub use crate::resources::move_window::NamespaceMoveState as NamespaceState;

/// A whole move as the target's record keeps it: the planner's view of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WholeRecord {
    pub phase: MovePhase,
    /// Every namespace, in the order clusterctl moves them, with where each is.
    pub namespaces: Vec<(String, NamespaceState)>,
    /// What handoff pauses in the source: every Cluster and ClusterClass, none paused when the
    /// move began (it refuses to begin otherwise), so each paused now was paused by handoff or
    /// by clusterctl.
    pub paused: Paused,
}

impl WholeRecord {
    /// The first namespace not moved yet, in the recorded order.
    pub fn next_namespace(&self) -> Option<&str> {
        self.namespaces
            .iter()
            .find(|(_, s)| *s != NamespaceState::Moved)
            .map(|(n, _)| n.as_str())
    }

    /// The namespace clusterctl was moving when the run stopped.
    pub fn in_flight(&self) -> Option<&str> {
        self.namespaces
            .iter()
            .find(|(_, s)| *s == NamespaceState::Copying)
            .map(|(n, _)| n.as_str())
    }
}

/// Why a whole move does not go on: kept typed to the command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WholeRefusal {
    #[error(transparent)]
    Order(#[from] AllRefusal),
    #[error(transparent)]
    Clusterctl(#[from] ClusterctlVersion),
    /// Paused in the source before the move began: not by handoff, and clusterctl moves
    /// nothing paused.
    #[error(transparent)]
    Paused(Paused),
    #[error(
        "clusterctl had begun deleting namespace {0} from the source: an --abort can no longer put it back; run the same handoff move again to finish the move"
    )]
    AbortPast(String),
    #[error(
        "every namespace is in the target already: an --abort has nothing to put back; run the same handoff move again to bring the controllers back"
    )]
    AbortCopied,
    #[error(
        "an --abort of this move is under way (phase Aborting): finish it with the same command and --abort before moving again"
    )]
    AbortUnfinished,
    #[error(
        "the move's record says phase {0:?}, which this handoff does not know: finish it with the handoff that wrote it"
    )]
    UnknownPhase(String),
}

/// What the source holds now, read where the planner asks (`reads`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WholeSeen {
    /// Every namespace to move, in order (`all_namespaces`): a run that begins.
    pub order: Seen<Result<Vec<String>, AllRefusal>>,
    /// Every Cluster and every ClusterClass of the source.
    pub clusters: Seen<Vec<ClusterSeen>>,
    pub classes: Seen<Vec<ClusterSeen>>,
    /// Whether clusterctl had begun deleting the namespace in flight: an `--abort` of a move
    /// that has one.
    pub deleting: Seen<bool>,
    /// What `clusterctl version -o short` said: a move that begins.
    pub version: Seen<String>,
    /// Every Cluster and ClusterClass of the target: after clusterctl moved a namespace.
    pub target_clusters: Seen<Vec<ClusterSeen>>,
    pub target_classes: Seen<Vec<ClusterSeen>>,
}

/// What the user asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WholeAsked {
    pub window: String,
    pub abort: bool,
}

crate::window::plan::declare::steps! {
/// One step of a whole management cluster's move or of its `--abort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WholeStep names WholeStepName {
    /// Both clusters' stops checked and clusterctl's version read; `warn` is what the planner
    /// could not tell from it. Nothing written.
    Check { warn: Option<ClusterctlVersion> },
    /// The move recorded in the target (`Moving`), before anything else is written: every
    /// namespace in clusterctl's order, pending, and what handoff pauses.
    Record { namespaces: Vec<String>, paused: Paused },
    /// Every Cluster and ClusterClass of the source paused, so that the providers lift their
    /// block-moves while their controllers still run.
    Pause(Paused),
    /// Until nothing in the source carries a provider's block-move; reads only.
    WaitUnblocked,
    /// `Stopping source` recorded; both clusters' controllers stopped at once as `window open
    /// --source --target` stops them, and proven stopped (each former leader's end, or its
    /// Lease's bound), their webhooks serving; `Copying` recorded.
    Stop,
    /// What is paused of what handoff recorded unpaused, so that clusterctl starts; nothing
    /// reconciles it now.
    Unpause(Paused),
    /// The namespace recorded `Copying`, clusterctl started on it, and waited for.
    Clusterctl { namespace: String },
    /// The namespace recorded moved, and the ClusterClasses (`namespace/name`) clusterctl
    /// paused and left in the source for the Clusters of the namespaces still to go unpaused.
    Moved {
        namespace: String,
        unpause_classes: Vec<String>,
        /// What is paused in the target of what handoff recorded: clusterctl unpauses the
        /// target as its last step, which a run killed before it never took (a re-run then
        /// finds nothing left in the source to unpause).
        unpause_target: Paused,
    },
    /// Record why clusterctl failed on a namespace, and end with it: both clusters stay
    /// stopped, and the same command goes on from that namespace.
    Fail(Failure),
    /// Every namespace moved: `Restoring` recorded.
    Copied,
    /// The target's controllers back.
    RestoreTarget,
    /// The source's controllers back; an `--abort` waits for their leaders.
    RestoreSource { wait_leading: bool },
    /// What handoff and clusterctl left paused in the source unpaused: on an `--abort`, and on
    /// a move that failed before it stopped anything.
    PutBack(Paused),
    /// Record that an `--abort` is under way.
    BeginAbort,
    /// Record the move done and report it, namespace by namespace.
    Finish,
    /// Record the `--abort` done (where a move was under way), naming the namespaces that
    /// stay in the target, and the one whose partial copy stays paused there.
    Aborted {
        moved: Vec<String>,
        in_flight: Option<String>,
        recorded: bool,
    },
    /// Stop, writing nothing more, and say why.
    Refuse(WholeRefusal),
    /// Remove what the windows brought along where nothing of handoff was installed.
    Uninstall,
    /// Nothing left to do.
    Done,
}
}

/// Why clusterctl failed, as recorded and said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub namespace: String,
    pub what: String,
    pub exit: Option<i32>,
}

/// Where a run is, in the order a run goes through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum WholeAt {
    #[default]
    Begun,
    Checked,
    Recorded,
    Paused,
    Unblocked,
    /// Both clusters stopped and proven stopped.
    Stopped,
    /// Unpaused, or a namespace moved: clusterctl on the next one, or `Copied`.
    Copying,
    /// clusterctl moved the namespace in flight: `Moved` next.
    Ran,
    /// clusterctl failed on the namespace in flight: `Fail` next.
    Failed,
    Copied,
    TargetBack,
    SourceBack,
    /// A step before the stop failed: `BeginAbort` next, then the way back.
    FailedBeforeStop,
    /// An `--abort` recorded under way.
    Aborting,
    PutBack,
    /// Finished, refused, aborted or failed: what the windows brought removed next.
    Ending,
    Uninstalled,
}

/// How a run ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Ended {
    #[default]
    No,
    Done,
    Aborted,
    Refused(WholeRefusal),
    Failed(Failure),
}

/// What this run has done: where it is, the record as this run wrote it (none until it
/// writes), and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WholeReached {
    pub at: WholeAt,
    pub record: Option<WholeRecord>,
    pub ended: Ended,
    /// A step before the stop failed in a run that paused: put back, then end with it.
    pub failed_before_stop: Option<String>,
}

/// What a step found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Nothing,
    /// clusterctl ended.
    Exited {
        status: ExitStatus,
        what: String,
    },
}

/// What the performer reads before the next step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WholeReads {
    pub order: bool,
    pub clusters: bool,
    pub deleting: bool,
    pub version: bool,
    pub target: bool,
}

/// A whole move's planner: what the user asked, and the target's record as read before the
/// run began (none where no move was recorded).
pub struct WholePlanner {
    pub asked: WholeAsked,
    pub record: Option<WholeRecord>,
}

fn keys_paused(v: &[ClusterSeen]) -> Vec<String> {
    v.iter()
        .filter(|c| c.paused)
        .map(|c| c.key.clone())
        .collect()
}

fn keys(v: &[ClusterSeen]) -> Vec<String> {
    v.iter().map(|c| c.key.clone()).collect()
}

impl WholePlanner {
    /// The record as this run last wrote it, else as it was read.
    fn record<'a>(&'a self, r: &'a WholeReached) -> Option<&'a WholeRecord> {
        r.record.as_ref().or(self.record.as_ref())
    }

    fn recorded<'a>(&'a self, r: &'a WholeReached) -> &'a WholeRecord {
        self.record(r)
            .expect("a whole move's step after its record, with no record")
    }

    fn record_mut<'a>(&self, r: &'a mut WholeReached) -> Option<&'a mut WholeRecord> {
        if r.record.is_none() {
            r.record = self.record.clone();
        }
        r.record.as_mut()
    }

    fn set_phase(&self, r: &mut WholeReached, phase: MovePhase) {
        if let Some(rec) = self.record_mut(r) {
            rec.phase = phase;
        }
    }

    fn set_state(&self, r: &mut WholeReached, namespace: &str, state: NamespaceState) {
        if let Some(rec) = self.record_mut(r)
            && let Some(n) = rec.namespaces.iter_mut().find(|(n, _)| n == namespace)
        {
            n.1 = state;
        }
    }

    /// What to read for the next step from `reached`: a run that begins reads the source
    /// whole and clusterctl's version; one that unpauses or puts back reads what is paused.
    pub fn reads(&self, r: &WholeReached) -> WholeReads {
        let live = self.record(r).filter(|rec| !rec.phase.is_over());
        match r.at {
            WholeAt::Begun => WholeReads {
                order: live.is_none() && !self.asked.abort,
                clusters: true,
                deleting: self.asked.abort && live.is_some_and(|rec| rec.in_flight().is_some()),
                version: live.is_none() && !self.asked.abort,
                target: false,
            },
            // What is recorded is the source as read right before the record.
            WholeAt::Checked => WholeReads {
                order: true,
                clusters: true,
                ..WholeReads::default()
            },
            WholeAt::Ran => WholeReads {
                clusters: true,
                target: true,
                ..WholeReads::default()
            },
            WholeAt::Stopped | WholeAt::SourceBack => WholeReads {
                clusters: true,
                ..WholeReads::default()
            },
            _ => WholeReads::default(),
        }
    }

    fn step(&self, seen: &WholeSeen, r: &WholeReached) -> WholeStep {
        match r.at {
            WholeAt::Begun => self.begin(seen, self.record.as_ref()),
            // Read again for the record: what changed since the checks is judged again.
            WholeAt::Checked => match self.refusal(seen) {
                Some(refuse) => refuse,
                None => WholeStep::Record {
                    namespaces: seen
                        .order
                        .get("the namespaces in order")
                        .clone()
                        .unwrap_or_default(),
                    paused: Paused {
                        clusters: keys(seen.clusters.get("every Cluster")),
                        classes: keys(seen.classes.get("every ClusterClass")),
                    },
                },
            },
            WholeAt::Recorded => WholeStep::Pause(self.recorded(r).paused.clone()),
            WholeAt::Paused => WholeStep::WaitUnblocked,
            WholeAt::Unblocked => WholeStep::Stop,
            WholeAt::Stopped => WholeStep::Unpause(now_paused(seen, &self.recorded(r).paused)),
            WholeAt::Copying => match self.recorded(r).next_namespace() {
                Some(ns) => WholeStep::Clusterctl {
                    namespace: ns.to_string(),
                },
                None => WholeStep::Copied,
            },
            WholeAt::Ran => WholeStep::Moved {
                namespace: self.recorded(r).in_flight().unwrap_or_default().to_string(),
                unpause_classes: now_paused(seen, &self.recorded(r).paused).classes,
                unpause_target: paused_in(
                    seen.target_clusters.get("the target's Clusters"),
                    seen.target_classes.get("the target's ClusterClasses"),
                    &self.recorded(r).paused,
                ),
            },
            WholeAt::Failed => match &r.ended {
                Ended::Failed(f) => WholeStep::Fail(f.clone()),
                e => unreachable!("failed, and ended {e:?}"),
            },
            WholeAt::Copied => WholeStep::RestoreTarget,
            WholeAt::TargetBack => WholeStep::RestoreSource {
                wait_leading: self.asked.abort,
            },
            WholeAt::SourceBack if self.asked.abort || r.failed_before_stop.is_some() => {
                WholeStep::PutBack(now_paused(seen, &self.recorded(r).paused))
            }
            WholeAt::SourceBack => WholeStep::Finish,
            WholeAt::FailedBeforeStop => WholeStep::BeginAbort,
            WholeAt::Aborting => WholeStep::RestoreTarget,
            // A run that failed before the stop is over once put back: recorded as undone.
            WholeAt::PutBack => WholeStep::Aborted {
                moved: moved(self.recorded(r)),
                in_flight: self.recorded(r).in_flight().map(String::from),
                recorded: true,
            },
            WholeAt::Ending => WholeStep::Uninstall,
            WholeAt::Uninstalled => WholeStep::Done,
        }
    }

    /// Where a run starts: afresh, where the record left off, or an `--abort`.
    fn begin(&self, seen: &WholeSeen, record: Option<&WholeRecord>) -> WholeStep {
        let live = record.filter(|r| !r.phase.is_over());
        match (live, self.asked.abort) {
            (None, true) => WholeStep::Aborted {
                moved: Vec::new(),
                in_flight: None,
                recorded: false,
            },
            (None, false) => self.fresh(seen),
            (Some(r), true) => match r.in_flight() {
                Some(ns) if *seen.deleting.get("whether clusterctl had begun deleting") => {
                    WholeStep::Refuse(WholeRefusal::AbortPast(ns.to_string()))
                }
                // Every namespace moved: nothing to put back.
                _ if r.phase == MovePhase::Restoring || r.next_namespace().is_none() => {
                    WholeStep::Refuse(WholeRefusal::AbortCopied)
                }
                _ => WholeStep::BeginAbort,
            },
            (Some(r), false) => match &r.phase {
                // Nothing stopped yet: pause again (idempotent) and go on.
                MovePhase::Moving => WholeStep::Pause(r.paused.clone()),
                MovePhase::Restoring => WholeStep::RestoreTarget,
                MovePhase::Aborting => WholeStep::Refuse(WholeRefusal::AbortUnfinished),
                MovePhase::Unknown(p) => WholeStep::Refuse(WholeRefusal::UnknownPhase(p.clone())),
                // From the stop on: take and prove both again, whatever a run before did.
                _ => WholeStep::Stop,
            },
        }
    }

    /// Why the source as read cannot be moved whole: no order, or something paused already.
    fn refusal(&self, seen: &WholeSeen) -> Option<WholeStep> {
        if let Err(e) = seen.order.get("the namespaces in order") {
            return Some(WholeStep::Refuse(e.clone().into()));
        }
        let paused = Paused {
            clusters: keys_paused(seen.clusters.get("every Cluster")),
            classes: keys_paused(seen.classes.get("every ClusterClass")),
        };
        (!(paused.clusters.is_empty() && paused.classes.is_empty()))
            .then_some(WholeStep::Refuse(WholeRefusal::Paused(paused)))
    }

    fn fresh(&self, seen: &WholeSeen) -> WholeStep {
        if let Some(refuse) = self.refusal(seen) {
            return refuse;
        }
        match move_plan::block_move_honoured(seen.version.get("clusterctl's version")) {
            Ok(()) => WholeStep::Check { warn: None },
            Err(e @ ClusterctlVersion::TooOld(_)) => WholeStep::Refuse(e.into()),
            Err(e) => WholeStep::Check { warn: Some(e) },
        }
    }

    fn heard(&self, r: &mut WholeReached, step: &WholeStep, o: Observation<'_, Found>) -> Verdict {
        match o {
            Observation::Done(found) => self.done(r, step, found),
            // A run that paused and had not stopped yet puts the source back, then ends with
            // the error; from the stop on, the same command goes on where it stopped.
            Observation::Failed(e)
                if matches!(
                    step,
                    WholeStep::Pause(_) | WholeStep::WaitUnblocked | WholeStep::Stop
                ) && self
                    .record(r)
                    .is_some_and(|rec| rec.phase == MovePhase::Moving) =>
            {
                // The controllers back (the stop may have taken some), then the source
                // unpaused, then the record says the move was undone.
                r.failed_before_stop = Some(e.to_string());
                r.at = WholeAt::FailedBeforeStop;
                Verdict::GoOn
            }
            Observation::Failed(_) => Verdict::End,
            Observation::Cut(_) => Verdict::GoOn,
        }
    }

    /// Where a step that ran to its end leaves the run, and what it wrote to the record.
    fn done(&self, r: &mut WholeReached, step: &WholeStep, found: Found) -> Verdict {
        r.at = match step {
            WholeStep::Check { .. } => WholeAt::Checked,
            WholeStep::Record { namespaces, paused } => {
                r.record = Some(WholeRecord {
                    phase: MovePhase::Moving,
                    namespaces: namespaces
                        .iter()
                        .map(|n| (n.clone(), NamespaceState::Pending))
                        .collect(),
                    paused: paused.clone(),
                });
                WholeAt::Recorded
            }
            WholeStep::Pause(_) => WholeAt::Paused,
            WholeStep::WaitUnblocked => WholeAt::Unblocked,
            WholeStep::Stop => {
                self.set_phase(r, MovePhase::Copying);
                WholeAt::Stopped
            }
            WholeStep::Unpause(_) => WholeAt::Copying,
            WholeStep::Clusterctl { namespace } => {
                self.set_state(r, namespace, NamespaceState::Copying);
                match found {
                    Found::Exited { status, what } if status.code != Some(0) => {
                        r.ended = Ended::Failed(Failure {
                            namespace: namespace.clone(),
                            what,
                            exit: Some(status.exit_code()),
                        });
                        WholeAt::Failed
                    }
                    _ => WholeAt::Ran,
                }
            }
            WholeStep::Moved { namespace, .. } => {
                self.set_state(r, namespace, NamespaceState::Moved);
                WholeAt::Copying
            }
            WholeStep::Fail(f) => {
                self.set_phase(r, MovePhase::Failed);
                r.ended = Ended::Failed(f.clone());
                return Verdict::End;
            }
            WholeStep::Copied => {
                self.set_phase(r, MovePhase::Restoring);
                WholeAt::Copied
            }
            WholeStep::RestoreTarget => WholeAt::TargetBack,
            WholeStep::RestoreSource { .. } => WholeAt::SourceBack,
            WholeStep::PutBack(_) => WholeAt::PutBack,
            WholeStep::BeginAbort => {
                self.set_phase(r, MovePhase::Aborting);
                WholeAt::Aborting
            }
            WholeStep::Finish => {
                self.set_phase(r, MovePhase::Done);
                r.ended = Ended::Done;
                WholeAt::Ending
            }
            WholeStep::Aborted { .. } => {
                self.set_phase(r, MovePhase::Aborted);
                r.ended = Ended::Aborted;
                WholeAt::Ending
            }
            WholeStep::Refuse(why) => {
                r.ended = Ended::Refused(why.clone());
                WholeAt::Ending
            }
            WholeStep::Uninstall => WholeAt::Uninstalled,
            WholeStep::Done => return Verdict::End,
        };
        Verdict::GoOn
    }
}

impl Planner for WholePlanner {
    type Step = WholeStep;
    type Name = WholeStepName;
    type Read = WholeSeen;
    type Reached = WholeReached;
    type Found = Found;

    fn of(&self) -> Of {
        Of::WholeMove
    }

    fn name(step: &WholeStep) -> WholeStepName {
        step.name()
    }

    fn next(&self, read: &WholeSeen, reached: &WholeReached) -> WholeStep {
        self.step(read, reached)
    }

    /// Before the stop, a failed step puts the source back and ends with its error; from the
    /// stop on, it ends the run where it is, and the same command goes on from the record.
    fn observe(
        &self,
        reached: &mut WholeReached,
        step: &WholeStep,
        o: Observation<'_, Found>,
    ) -> Verdict {
        self.heard(reached, step, o)
    }
}

fn moved(r: &WholeRecord) -> Vec<String> {
    r.namespaces
        .iter()
        .filter(|(_, s)| *s == NamespaceState::Moved)
        .map(|(n, _)| n.clone())
        .collect()
}

/// Of `recorded`, what is paused in these Clusters and ClusterClasses.
fn paused_in(clusters: &[ClusterSeen], classes: &[ClusterSeen], recorded: &Paused) -> Paused {
    let paused = |v: &[ClusterSeen], keys: &[String]| -> Vec<String> {
        v.iter()
            .filter(|c| c.paused && keys.contains(&c.key))
            .map(|c| c.key.clone())
            .collect()
    };
    Paused {
        clusters: paused(clusters, &recorded.clusters),
        classes: paused(classes, &recorded.classes),
    }
}

/// Of `recorded`, what is paused now in the source.
fn now_paused(seen: &WholeSeen, recorded: &Paused) -> Paused {
    paused_in(
        seen.clusters.get("every Cluster"),
        seen.classes.get("every ClusterClass"),
        recorded,
    )
}

#[cfg(test)]
mod tests;
