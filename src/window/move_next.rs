//! `handoff move`'s one next step, pure: from the target's record, the namespace's Clusters as
//! read now, and what this run has done so far, the single thing to do next. The driver
//! (`mover`) reads, asks `next`, performs that step, tells `Run` it did, and comes back, as
//! Cluster API's KubeadmControlPlane reconciler does; so every rule of where a run starts,
//! resumes, aborts and ends is here, tested one row per phase and observation, and the
//! performing code decides nothing.

use super::declare::steps;
use super::move_plan::{self, BlockMoveOn, ClusterSeen, Start, StartError, abort_refused};
use crate::resources::move_window::{MoveRecord, MoveRole};
use crate::resources::phase::MovePhase;

/// What the user asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub window: String,
    /// `--namespace` (resolved as clusterctl resolves it).
    pub namespace: String,
    pub abort: bool,
}

/// What the driver read before the step, beside the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The namespace's Clusters in the source and in the target, and the Clusters of other
    /// namespaces in the source that use a ClusterClass of this one: read while `reads` says
    /// the next step may need them.
    pub source: Vec<ClusterSeen>,
    pub target: Vec<ClusterSeen>,
    pub class_users: Vec<ClusterSeen>,
    /// The source's ClusterClasses the move touches, in whatever namespace: the namespace's
    /// own, those its Clusters use (`move_plan::classes_used`) and those the record names.
    pub classes: Vec<ClusterSeen>,
    /// Whether clusterctl had begun deleting from the source: read where a recorded move is
    /// picked up (`reads`).
    pub deleting: bool,
}

/// How clusterctl's part of this run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// clusterctl exited 0.
    Moved,
    /// clusterctl exited otherwise: its code as recorded (`-1`: killed by a signal), and
    /// `what` to say.
    Exited { exit: i32, what: String },
    /// handoff could not go on (an error while it held or ran clusterctl).
    Stopped(String),
}

/// What this run has done, step by step (`performed`): everything `next` needs that no
/// cluster records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Run {
    /// How this run began, decided by its first step.
    pub began: Option<Start>,
    pub checked: bool,
    /// A resumed move's source put back as clusterctl expects it, or kept stopped.
    pub source_prepared: bool,
    /// The target's controllers taken, and the source Clusters handoff's block-move goes on.
    pub target_taken: bool,
    pub block_move: BlockMoveOn,
    /// Proven before clusterctl starts: only where the source is stopped already.
    pub target_proven: bool,
    /// handoff's block-move on, the move recorded as `Moving`.
    pub held: bool,
    pub clusterctl: Option<Outcome>,
    pub lifted: bool,
    pub target_unpaused: bool,
    /// What clusterctl paused and left in the source unpaused (`UnpauseSource`).
    pub source_unpaused: bool,
    /// The move recorded as copied (`Restoring`).
    pub copied: bool,
    pub restored: Vec<MoveRole>,
    pub aborting: bool,
    pub finished: bool,
    /// What the windows brought along removed (`installed::remove`).
    pub uninstalled: bool,
}

steps! {
/// One step of a move or of its `--abort`; each is performed by one function of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step names StepName {
    /// Say how this run begins; nothing is written.
    Begin(Start),
    /// Stop, writing nothing more, and say which cluster refused and why.
    Refuse { cluster: MoveRole, message: String },
    /// Both clusters' stops checked (the preflight) and clusterctl's version; nothing written.
    Check,
    /// A resumed move: the source's controllers run again, what clusterctl paused unpaused.
    PutSourceBack,
    /// A move resumed after clusterctl began deleting: the source stays stopped (opened and
    /// proven), its Clusters unpaused so that clusterctl starts.
    KeepSourceStopped,
    /// The source's standbys added, the target's controllers taken (proven later), the move's
    /// record begun.
    StopTarget { block_move: BlockMoveOn },
    /// The target proven stopped before clusterctl starts (the source is stopped already).
    ProveTarget,
    /// The move recorded `Moving`, handoff's block-move on.
    Hold,
    /// clusterctl, with the source stopped (and both proven) once it paused them.
    RunClusterctl,
    /// handoff's block-move off every source Cluster.
    Lift {
        /// A failure is said, not fatal: the move's way out, which must go on to record what
        /// happened.
        warn: bool,
    },
    /// Record why clusterctl's part failed, and end with it.
    Fail,
    /// Unpause these target Clusters, as clusterctl's last step would have.
    UnpauseTarget(Vec<String>),
    /// Unpause these source ClusterClasses (`namespace/name`), which clusterctl paused and left
    /// in the source for the Clusters of other namespaces that use them.
    UnpauseSource(Vec<String>),
    /// Record that clusterctl moved everything (`Restoring`).
    Copied,
    /// The target's controllers back.
    RestoreTarget,
    /// The source's controllers back.
    RestoreSource,
    /// Record the move done and report it.
    Finish,
    /// Record that an `--abort` is under way.
    BeginAbort,
    /// Record the `--abort` done and report what clusterctl left behind.
    Aborted,
    /// Remove what the windows brought along where nothing of handoff was installed (their
    /// policies, the windows, the MoveWindow CRD where no other window uses it); nothing
    /// where an admin installed handoff.
    Uninstall,
    /// Nothing left to do.
    Done,
}
}

impl Step {
    /// The step that brings `role`'s controllers back.
    pub fn restore(role: MoveRole) -> Step {
        match role {
            MoveRole::Target => Step::RestoreTarget,
            MoveRole::Source => Step::RestoreSource,
        }
    }

    /// A failure of this step is the run's outcome, not its end: from the block-move on, every
    /// way out lifts it and records why.
    pub fn fails_into_outcome(&self) -> bool {
        matches!(self, Step::Hold | Step::RunClusterctl)
    }
}

impl Run {
    /// What this run knows once `step` was performed (clusterctl's outcome is the driver's
    /// to set: it is what the step found).
    pub fn performed(&mut self, step: &Step) {
        match step {
            Step::Begin(s) => self.began = Some(s.clone()),
            Step::Check => self.checked = true,
            Step::PutSourceBack | Step::KeepSourceStopped => self.source_prepared = true,
            Step::StopTarget { block_move } => {
                self.target_taken = true;
                self.block_move = block_move.clone();
            }
            Step::ProveTarget => self.target_proven = true,
            Step::Hold => self.held = true,
            Step::Lift { .. } => self.lifted = true,
            Step::UnpauseTarget(_) => self.target_unpaused = true,
            Step::UnpauseSource(_) => self.source_unpaused = true,
            Step::Copied => self.copied = true,
            Step::RestoreTarget => self.restored.push(MoveRole::Target),
            Step::RestoreSource => self.restored.push(MoveRole::Source),
            Step::BeginAbort => self.aborting = true,
            Step::Finish | Step::Aborted => self.finished = true,
            Step::Uninstall => self.uninstalled = true,
            Step::RunClusterctl | Step::Refuse { .. } | Step::Fail | Step::Done => {}
        }
    }
}

/// The namespace a run acts on: an `--abort` acts on the recorded move's, whatever
/// `--namespace` says.
pub fn namespace(asked: &Asked, record: Option<&MoveRecord>) -> String {
    match record {
        Some(r) if asked.abort && !r.namespace.is_empty() => r.namespace.clone(),
        _ => asked.namespace.clone(),
    }
}

/// What the driver reads for the next step, beside the record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    /// The Clusters (`Observed::source`, `target`, `class_users`): until the target is taken
    /// (where a run starts, what is paused, where the block-move goes) and for a finished
    /// copy's unpause.
    pub clusters: bool,
    /// The ClusterClasses the move touches: with the Clusters, and for the source's unpause at
    /// the end of a move or an `--abort`.
    pub classes: bool,
    /// Whether clusterctl had begun deleting (a scan of every moved kind): only where a
    /// recorded move is picked up.
    pub deletes: bool,
}

pub fn reads(asked: &Asked, record: Option<&MoveRecord>, run: &Run) -> Reads {
    let picking_up = run.began.is_none() && record.is_some_and(|r| !r.phase.is_over());
    // A move recorded done: whether it is done indeed (`Start::Tidy`).
    let done = run.began.is_none()
        && record.is_some_and(|r| {
            r.phase == MovePhase::Done && (asked.abort || r.namespace == asked.namespace)
        });
    let clusters = picking_up
        || done
        || (!asked.abort && run.began.is_some() && !run.target_taken && !run.copied);
    let unpausing = !run.source_unpaused
        && run.began.as_ref().is_some_and(|b| *b != Start::Tidy)
        && match asked.abort {
            true => run.lifted,
            false => run.copied,
        };
    Reads {
        clusters,
        classes: clusters || unpausing,
        deletes: picking_up,
    }
}

fn refuse(cluster: MoveRole, message: impl ToString) -> Step {
    Step::Refuse {
        cluster,
        message: message.to_string(),
    }
}

/// The one next step.
pub fn next(asked: &Asked, record: Option<&MoveRecord>, seen: &Observed, run: &Run) -> Step {
    match (&run.began, asked.abort) {
        // Moved already, with or without --abort: nothing to undo, what is left removed.
        (Some(Start::Tidy), _) => match run.uninstalled {
            false => Step::Uninstall,
            true => Step::Done,
        },
        (None, false) => begin(asked, record, seen),
        (None, true) => begin_abort(asked, record, seen),
        (Some(_), true) => next_abort(record, seen, run),
        (Some(start), false) => match start {
            Start::Tidy => Step::Done,
            Start::RestoreOnly | Start::FinishTarget => next_restore(start, record, seen, run),
            Start::Fresh | Start::Resume | Start::ResumeStopped => {
                next_move(asked, start, record, seen, run)
            }
        },
    }
}

/// Where a run starts: from the record, refined where a recorded move is resumed by whether
/// clusterctl had begun deleting from the source.
fn begin(asked: &Asked, record: Option<&MoveRecord>, seen: &Observed) -> Step {
    match move_plan::start(record, &asked.window, &asked.namespace) {
        Err(e) => refuse(MoveRole::Target, e),
        Ok(Start::Resume) => {
            let r = record.expect("a resume has a record");
            Step::Begin(move_plan::resume(
                r,
                &seen.source,
                &seen.target,
                seen.deleting,
            ))
        }
        Ok(Start::Fresh)
            if record.is_some_and(|r| {
                move_plan::moved_already(r, &asked.namespace, &seen.source, &seen.target)
            }) =>
        {
            Step::Begin(Start::Tidy)
        }
        Ok(s) => Step::Begin(s),
    }
}

/// An `--abort` acts only where restarting the source's controllers cannot re-create what
/// clusterctl deleted; one that did not finish is finished by the next.
fn begin_abort(asked: &Asked, record: Option<&MoveRecord>, seen: &Observed) -> Step {
    let Some(r) = record else {
        return Step::Begin(Start::Fresh);
    };
    if move_plan::moved_already(r, &r.namespace, &seen.source, &seen.target) {
        return Step::Begin(Start::Tidy);
    }
    let start = match move_plan::start(Some(r), &asked.window, &r.namespace) {
        Ok(Start::Resume) | Err(StartError::AbortUnfinished { .. }) => {
            move_plan::resume(r, &seen.source, &seen.target, seen.deleting)
        }
        Ok(s) => s,
        Err(e) => return refuse(MoveRole::Target, e),
    };
    match abort_refused(&start, &r.namespace) {
        Some(why) => refuse(MoveRole::Target, why),
        None => Step::Begin(start),
    }
}

/// Every controller back, the source's first (it still owns what was not moved), after
/// the ClusterClasses of other namespaces that clusterctl paused are unpaused.
fn next_abort(record: Option<&MoveRecord>, seen: &Observed, run: &Run) -> Step {
    if record.is_some() && !run.aborting {
        return Step::BeginAbort;
    }
    if !run.lifted {
        return Step::Lift { warn: false };
    }
    if let Some(step) = unpause_source(record, seen, run, true) {
        return step;
    }
    bring_back([MoveRole::Source, MoveRole::Target], Step::Aborted, run)
}

/// The ClusterClasses clusterctl paused and left in the source, unpaused once; no step where
/// it left none (the common case: a namespace whose Clusters use classes of their own).
fn unpause_source(
    record: Option<&MoveRecord>,
    seen: &Observed,
    run: &Run,
    elsewhere_only: bool,
) -> Option<Step> {
    if run.source_unpaused {
        return None;
    }
    let classes = record
        .map(|r| {
            move_plan::classes_to_unpause(
                &r.namespace,
                &r.cluster_classes,
                &seen.classes,
                elsewhere_only,
            )
        })
        .unwrap_or_default();
    (!classes.is_empty()).then_some(Step::UnpauseSource(classes))
}

/// Each cluster's controllers back in `order`, then `last` (which records and reports), then
/// done.
fn bring_back(order: [MoveRole; 2], last: Step, run: &Run) -> Step {
    match order.into_iter().find(|role| !run.restored.contains(role)) {
        Some(role) => Step::restore(role),
        None if !run.finished => last,
        None if !run.uninstalled => Step::Uninstall,
        None => Step::Done,
    }
}

/// A move whose clusterctl succeeded in an earlier run: the target's Clusters unpaused where
/// clusterctl did not get to it, then the restore.
fn next_restore(start: &Start, record: Option<&MoveRecord>, seen: &Observed, run: &Run) -> Step {
    if *start == Start::FinishTarget && !run.target_unpaused {
        let moved = record.map(|r| r.clusters.as_slice()).unwrap_or_default();
        return Step::UnpauseTarget(
            seen.target
                .iter()
                .filter(|c| c.paused && moved.contains(&c.key))
                .map(|c| c.key.clone())
                .collect(),
        );
    }
    restore(record, seen, run)
}

/// The restore, the target's controllers first (the namespace is theirs now), after the
/// source's ClusterClasses that clusterctl paused and left there are unpaused.
fn restore(record: Option<&MoveRecord>, seen: &Observed, run: &Run) -> Step {
    if !run.copied {
        return Step::Copied;
    }
    if let Some(step) = unpause_source(record, seen, run, false) {
        return step;
    }
    bring_back([MoveRole::Target, MoveRole::Source], Step::Finish, run)
}

/// A move from its checks to clusterctl's exit, then its way out.
fn next_move(
    asked: &Asked,
    start: &Start,
    record: Option<&MoveRecord>,
    seen: &Observed,
    run: &Run,
) -> Step {
    let source_stopped = *start == Start::ResumeStopped;
    if !run.checked {
        return Step::Check;
    }
    if !run.source_prepared && *start != Start::Fresh {
        return match source_stopped {
            true => Step::KeepSourceStopped,
            false => Step::PutSourceBack,
        };
    }
    if !run.target_taken {
        return take_target(asked, seen, source_stopped);
    }
    if source_stopped && !run.target_proven {
        return Step::ProveTarget;
    }
    if !run.held && run.clusterctl.is_none() {
        return Step::Hold;
    }
    let Some(outcome) = &run.clusterctl else {
        return Step::RunClusterctl;
    };
    if !run.lifted {
        return Step::Lift { warn: true };
    }
    match outcome {
        Outcome::Moved => restore(record, seen, run),
        Outcome::Exited { .. } | Outcome::Stopped(_) => Step::Fail,
    }
}

/// clusterctl refuses to start while a Cluster or ClusterClass it would move is paused
/// (v1.12+), a ClusterClass of another namespace included; every Cluster (or, in a namespace
/// of ClusterClasses alone, every class) gets handoff's block-move, or nothing would hold
/// clusterctl's copy until the source is stopped (unless it is stopped already).
fn take_target(asked: &Asked, seen: &Observed, source_stopped: bool) -> Step {
    if let Some(why) = move_plan::paused_before(&seen.source, &seen.classes) {
        return refuse(MoveRole::Source, why);
    }
    match source_stopped {
        true => Step::StopTarget {
            block_move: BlockMoveOn::default(),
        },
        false => match move_plan::add_block_move(
            &asked.namespace,
            &seen.source,
            &seen.classes,
            &seen.class_users,
            &asked.window,
        ) {
            Ok(block_move) => Step::StopTarget { block_move },
            Err(e) => refuse(MoveRole::Source, e),
        },
    }
}

#[cfg(test)]
mod tests;
