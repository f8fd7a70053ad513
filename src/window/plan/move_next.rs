//! `handoff move`'s one next step, pure: from the target's record, the namespace's Clusters as
//! read now, and what this run has done so far, the single thing to do next. The driver
//! (`mover`) reads, asks `next`, performs that step, tells `Reached` it did, and comes back, as
//! Cluster API's KubeadmControlPlane reconciler does; so every rule of where a run starts,
//! resumes, aborts and ends is here, tested one row per phase and observation, and the
//! performing code decides nothing.

mod reached;

pub use reached::{AbortAt, Begun, FinishAt, MoveAt, Path, Reached, Seen, Span, SpanAt};

use crate::resources::move_window::{MoveRecord, MoveRole};
use crate::resources::phase::MovePhase;
use crate::window::plan::declare::{Of, steps};
use crate::window::plan::move_plan::{
    self, BlockMoveOn, ClusterSeen, ClusterctlVersion, Paused, Refusal, Start, StartError,
    abort_refused,
};
use crate::window::plan::planner::{Catch, ExitStatus, Interrupt, Observation, Planner, Verdict};

/// What the user asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub window: String,
    /// `--namespace` (resolved as clusterctl resolves it).
    pub namespace: String,
    pub abort: bool,
}

/// What the driver read before the step, beside the record: each only where `reads` asked
/// for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The namespace's Clusters in the source and in the target, and the Clusters of other
    /// namespaces in the source that use a ClusterClass of this one.
    pub source: Seen<Vec<ClusterSeen>>,
    pub target: Seen<Vec<ClusterSeen>>,
    pub class_users: Seen<Vec<ClusterSeen>>,
    /// The source's ClusterClasses the move touches, in whatever namespace: the namespace's
    /// own, those its Clusters use (`move_plan::classes_used`) and those the record names.
    pub classes: Seen<Vec<ClusterSeen>>,
    /// Whether clusterctl had begun deleting from the source.
    pub deleting: Seen<bool>,
    /// What `clusterctl version -o short` said.
    pub version: Seen<String>,
    /// Whether the source's window is open.
    pub source_open: Seen<bool>,
}

impl Observed {
    pub fn source(&self) -> &[ClusterSeen] {
        self.source.get("the source's Clusters")
    }
    pub fn target(&self) -> &[ClusterSeen] {
        self.target.get("the target's Clusters")
    }
    pub fn class_users(&self) -> &[ClusterSeen] {
        self.class_users
            .get("the Clusters of other namespaces that use a ClusterClass of this one")
    }
    pub fn classes(&self) -> &[ClusterSeen] {
        self.classes.get("the ClusterClasses the move touches")
    }
    pub fn deleting(&self) -> bool {
        *self.deleting.get("whether clusterctl had begun deleting")
    }
    pub fn version(&self) -> &str {
        self.version.get("clusterctl's version")
    }
    pub fn source_open(&self) -> bool {
        *self.source_open.get("whether the source's window is open")
    }
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

/// Why handoff signals clusterctl.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Because {
    /// handoff was interrupted (SIGINT, SIGTERM) and passes the signal on; `copying`: the
    /// block-move was lifted already.
    Interrupted { copying: bool },
    /// The source could not be stopped: clusterctl must not copy with its controllers running.
    Stopped(String),
}

/// Why handoff lifts its block-move, which says what a failure of the lift is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifting {
    /// Both clusters proven stopped: clusterctl copies from now on. A failure is said, and
    /// clusterctl stays held until it gives up; the way out lifts again.
    Copy,
    /// clusterctl's part is over: the move's way out, which must go on to record what
    /// happened, so a failure is said, not fatal.
    WayOut,
    /// An `--abort`: a failure ends it (the same `--abort` again finishes it).
    Abort,
}

/// What a step of the move found that the planner needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Nothing,
    /// The source's Clusters clusterctl paused (`AwaitPause`).
    SourcePaused(Vec<String>),
}

steps! {
/// One step of a move or of its `--abort`; each is performed by one function of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step names StepName {
    /// Say how this run begins; nothing is written.
    Begin(Begun),
    /// Stop, writing nothing more, and say which cluster refused and why.
    Refuse { cluster: MoveRole, why: Refusal },
    /// Both clusters' stops checked (the preflight); clusterctl's version was read before it,
    /// and `warn` is what the planner could not tell from it. Nothing written.
    Check { warn: Option<ClusterctlVersion> },
    /// A resumed move: the source's controllers run again, what clusterctl paused unpaused.
    PutSourceBack {
        /// The source's window is open (an earlier attempt stopped it): close it first.
        close_window: bool,
        unpause: Paused,
    },
    /// A move resumed after clusterctl began deleting: the source stays stopped (opened and
    /// proven), its Clusters unpaused so that clusterctl starts.
    KeepSourceStopped { unpause: Paused },
    /// The source's standbys added, the target's controllers taken (proven later), the move's
    /// record begun.
    StopTarget {
        /// Where `Hold` puts handoff's block-move.
        block_move: BlockMoveOn,
        /// The source's standbys readied first, so that they are Ready once clusterctl paused
        /// the source; not where the source is stopped already.
        standbys_first: bool,
        /// A resumed move keeps when each cluster's controllers stopped first.
        keep_stop_times: bool,
    },
    /// The target proven stopped before clusterctl starts (the source is stopped already).
    ProveTarget,
    /// The move recorded `Moving`, handoff's block-move on.
    Hold { block_move: BlockMoveOn },
    /// clusterctl started (in a process group of its own, bound to die with handoff), the
    /// source's Clusters watched from before it starts where the source is stopped once they
    /// are paused.
    StartClusterctl { watch_pause: bool },
    /// Wait until clusterctl has paused every source Cluster and nothing but handoff's
    /// block-move holds it; reads only.
    AwaitPause,
    /// `Stopping source` recorded (with what clusterctl paused), the source's controllers
    /// taken: not yet proven.
    StopSource { paused: Vec<String> },
    /// Both clusters' controllers proven stopped (each former leader's end, or its Lease's
    /// bound) and serving their webhooks; `Copying` recorded. The block-move still holds
    /// clusterctl.
    ProveStopped,
    /// Wait for clusterctl to end.
    AwaitClusterctl,
    /// Pass a signal on to clusterctl (SIGINT or SIGTERM that handoff caught, or SIGTERM where
    /// the source could not be stopped), and say why.
    SignalClusterctl { signal: i32, because: Because },
    /// Say how clusterctl ended; warn where it copied without waiting for handoff's block-move.
    ClusterctlExited { status: ExitStatus, unheld: bool },
    /// handoff's block-move off every source Cluster, for the reason it carries.
    Lift(Lifting),
    /// Record why clusterctl's part failed, and end with it.
    Fail(Outcome),
    /// Unpause these target Clusters, as clusterctl's last step would have.
    UnpauseTarget(Vec<String>),
    /// Unpause these source ClusterClasses (`namespace/name`), which clusterctl paused and left
    /// in the source for the Clusters of other namespaces that use them.
    UnpauseSource(Vec<String>),
    /// Record that clusterctl moved everything (`Restoring`).
    Copied,
    /// The target's controllers back.
    RestoreTarget,
    /// The source's controllers back; an `--abort` waits for their leaders (the namespace is
    /// theirs again), a finished move does not (nothing of it waits on them).
    RestoreSource { wait_leading: bool },
    /// Record the move done and report it.
    Finish,
    /// Record that an `--abort` is under way.
    BeginAbort,
    /// Record the `--abort` done (where a move was recorded) and report what clusterctl left
    /// behind.
    Aborted { recorded: bool },
    /// Remove what the windows brought along where nothing of handoff was installed (their
    /// policies, the windows, the MoveWindow CRD where no other window uses it); nothing
    /// where an admin installed handoff.
    Uninstall,
    /// Nothing left to do.
    Done,
}
}

impl Step {
    /// A failure of this step is the run's outcome, not its end: from the block-move on, every
    /// way out lifts it and records why.
    pub fn fails_into_outcome(&self) -> bool {
        matches!(self, Step::Hold { .. } | Step::StartClusterctl { .. })
    }
}

/// `handoff move`'s planner, for the runner: what the user asked, and the pure functions of
/// this file.
pub struct MovePlanner {
    pub asked: Asked,
}

/// What the driver read for the next step: the target's record (`reads_record`), what `reads`
/// asked for of both clusters, and the namespace it was read in.
pub struct Read {
    pub record: Seen<Option<MoveRecord>>,
    pub reads: Reads,
    pub seen: Observed,
}

impl Planner for MovePlanner {
    type Step = Step;
    type Name = StepName;
    type Read = Read;
    type Reached = Reached;
    type Found = Found;
    fn of(&self) -> Of {
        Of::Move
    }

    fn name(step: &Step) -> StepName {
        step.name()
    }

    /// The waits, and the source's stop and proof: the block-move still holds clusterctl
    /// there, so it has copied nothing, and the way out (`Lift`, `Fail`) is right wherever they
    /// are cut, as after a `kill -9`. Single writes (the record, the lift) run to their end, so
    /// that the run knows what it wrote.
    fn cuttable(step: &Step) -> bool {
        matches!(
            step,
            Step::AwaitPause | Step::StopSource { .. } | Step::ProveStopped | Step::AwaitClusterctl
        )
    }

    /// From the checks until the block-move is on, a signal is held (it stops the move before
    /// clusterctl starts); from then until clusterctl ended, it goes to clusterctl; before and
    /// after, it ends handoff (what is left is recorded).
    fn catch(&self, reached: &Reached) -> Catch {
        match reached.begun().map(|b| &b.path) {
            Some(Path::Move(MoveAt::Begun)) | None => Catch::Default,
            Some(Path::Move(MoveAt::Held) | Path::Clusterctl(_)) => Catch::Deliver,
            Some(Path::Move(_)) => Catch::Hold,
            Some(_) => Catch::Default,
        }
    }

    fn next(&self, read: &Read, reached: &Reached) -> Step {
        if let Some(b) = reached.begun()
            && let Path::Clusterctl(span) = &b.path
        {
            return next_in_span(b, span);
        }
        let record = read.record.get("the move's record");
        next(&self.asked, record.as_ref(), &read.seen, reached)
    }

    /// From the block-move on, a failed step ends clusterctl's part, not the run: the next
    /// steps lift the block-move and record why. `Refuse` and `Fail` end the run with their
    /// error, `Done` with nothing.
    fn observe(&self, reached: &mut Reached, step: &Step, o: Observation<'_, Found>) -> Verdict {
        match o {
            Observation::Done(_) if *step == Step::Done => Verdict::End,
            Observation::Done(found) => {
                reached.performed(step, found);
                Verdict::GoOn
            }
            Observation::Failed(e) if step.fails_into_outcome() => {
                reached.ended(Outcome::Stopped(format!("handoff move stopped: {e}")));
                Verdict::GoOn
            }
            Observation::Failed(e)
                if matches!(step, Step::StopSource { .. } | Step::ProveStopped) =>
            {
                reached.source_not_stopped(e.to_string());
                Verdict::GoOn
            }
            Observation::Failed(_) => Verdict::End,
            Observation::Cut(i) => {
                reached.interrupted(i);
                Verdict::GoOn
            }
        }
    }

    fn interrupted(&self, reached: &mut Reached, i: Interrupt) {
        reached.interrupted(i);
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reads {
    /// The namespace the run acts on: `namespace` until it begins, then what it began on.
    pub namespace: String,
    /// The Clusters (`Observed::source`, `target`, `class_users`): until the target is taken
    /// (where a run starts, what is paused, where the block-move goes) and for a finished
    /// copy's unpause of the target.
    pub clusters: bool,
    /// The ClusterClasses the move touches: with the Clusters, and for the source's unpause at
    /// the end of a move or an `--abort`.
    pub classes: bool,
    /// Whether clusterctl had begun deleting (a scan of every moved kind): only where a
    /// recorded move is picked up.
    pub deletes: bool,
    /// clusterctl's version: before the checks of a move (not of an `--abort`).
    pub version: bool,
    /// Whether the source's window is open: where a resumed move puts the source back.
    pub source_window: bool,
}

/// Whether the record is read before the next step: not while clusterctl runs, where nothing
/// of it decides the next step, and where a read that failed would end the run under
/// clusterctl's copy (and kill it: the child dies with handoff's run).
pub fn reads_record(reached: &Reached) -> bool {
    !matches!(reached.begun().map(|b| &b.path), Some(Path::Clusterctl(_)))
}

pub fn reads(asked: &Asked, record: Option<&MoveRecord>, reached: &Reached) -> Reads {
    let Some(b) = reached.begun() else {
        let picking_up = record.is_some_and(|r| !r.phase.is_over());
        // A move recorded done: whether it is done indeed (`Start::Tidy`).
        let done = record.is_some_and(|r| {
            r.phase == MovePhase::Done && (asked.abort || r.namespace == asked.namespace)
        });
        return Reads {
            namespace: namespace(asked, record),
            clusters: picking_up || done,
            classes: picking_up || done,
            deletes: picking_up,
            version: false,
            source_window: false,
        };
    };
    let clusters = match &b.path {
        Path::Move(MoveAt::Begun | MoveAt::Checked | MoveAt::SourcePrepared) => true,
        Path::Finish(FinishAt::Begun) => b.start == Start::FinishTarget,
        _ => false,
    };
    let unpausing = matches!(
        b.path,
        Path::Finish(FinishAt::Copied) | Path::Abort(AbortAt::Lifted)
    );
    Reads {
        namespace: b.namespace.clone(),
        clusters,
        classes: clusters || unpausing,
        deletes: false,
        version: matches!(b.path, Path::Move(MoveAt::Begun)),
        source_window: matches!(b.path, Path::Move(MoveAt::Checked)) && b.start == Start::Resume,
    }
}

fn refuse(cluster: MoveRole, why: impl Into<Refusal>) -> Step {
    Step::Refuse {
        cluster,
        why: why.into(),
    }
}

/// What clusterctl paused in the source in the recorded attempt and a resumed move unpauses
/// (clusterctl refuses to start while any is paused): its Clusters, and its ClusterClasses
/// wherever they are (one of another namespace that the moved Clusters use is paused as
/// theirs are).
fn unpause_for_clusterctl(r: &MoveRecord, seen: &Observed) -> Paused {
    Paused {
        clusters: move_plan::to_unpause(&r.paused_by_clusterctl, &r.clusters, seen.source()),
        classes: move_plan::to_unpause(&[], &r.cluster_classes, seen.classes()),
    }
}

/// A clusterctl older than its block-move wait is refused: nothing would hold its copy until
/// both clusters are proven stopped. One whose version cannot be read is warned about.
fn check(seen: &Observed) -> Step {
    match move_plan::block_move_honoured(seen.version()) {
        Ok(()) => Step::Check { warn: None },
        Err(e @ ClusterctlVersion::TooOld(_)) => refuse(MoveRole::Source, e),
        Err(e) => Step::Check { warn: Some(e) },
    }
}

/// The one next step.
pub fn next(
    asked: &Asked,
    record: Option<&MoveRecord>,
    seen: &Observed,
    reached: &Reached,
) -> Step {
    let Some(b) = reached.begun() else {
        return match asked.abort {
            false => begin(asked, record, seen),
            true => begin_abort(asked, record, seen),
        };
    };
    match &b.path {
        Path::Move(at) => next_move(asked, b, at, record, seen),
        Path::Clusterctl(span) => next_in_span(b, span),
        Path::Ended(_) => Step::Lift(Lifting::WayOut),
        Path::Failing(why) => Step::Fail(why.clone()),
        Path::Finish(at) => next_restore(b, *at, record, seen),
        Path::Abort(at) => next_abort(b, *at, record, seen),
        // Moved already, with or without --abort: nothing to undo, what is left removed.
        Path::Tidy { uninstalled: false } => Step::Uninstall,
        Path::Tidy { uninstalled: true } => Step::Done,
    }
}

/// Where a run starts: from the record, refined where a recorded move is resumed by whether
/// clusterctl had begun deleting from the source.
fn begin(asked: &Asked, record: Option<&MoveRecord>, seen: &Observed) -> Step {
    let begun = |start| Step::Begin(Begun::new(&asked.namespace, start, false));
    match move_plan::start(record, &asked.window, &asked.namespace) {
        Err(e) => refuse(MoveRole::Target, e),
        Ok(Start::Resume) => {
            let r = record.expect("a resume has a record");
            begun(move_plan::resume(
                r,
                seen.source(),
                seen.target(),
                seen.deleting(),
            ))
        }
        Ok(Start::Fresh)
            if record.is_some_and(|r| {
                // Read only where it can be so (`reads`).
                r.phase == MovePhase::Done
                    && r.namespace == asked.namespace
                    && move_plan::moved_already(r, &asked.namespace, seen.source(), seen.target())
            }) =>
        {
            begun(Start::Tidy)
        }
        Ok(s) => begun(s),
    }
}

/// An `--abort` acts only where restarting the source's controllers cannot re-create what
/// clusterctl deleted; one that did not finish is finished by the next.
fn begin_abort(asked: &Asked, record: Option<&MoveRecord>, seen: &Observed) -> Step {
    let Some(r) = record else {
        return Step::Begin(Begun::new(&asked.namespace, Start::Fresh, true));
    };
    let begun = |start| Step::Begin(Begun::new(&namespace(asked, record), start, true));
    if r.phase == MovePhase::Done
        && move_plan::moved_already(r, &r.namespace, seen.source(), seen.target())
    {
        return begun(Start::Tidy);
    }
    let start = match move_plan::start(Some(r), &asked.window, &r.namespace) {
        Ok(Start::Resume) | Err(StartError::AbortUnfinished { .. }) => {
            move_plan::resume(r, seen.source(), seen.target(), seen.deleting())
        }
        Ok(s) => s,
        Err(e) => return refuse(MoveRole::Target, e),
    };
    match abort_refused(&start, &r.namespace) {
        Some(why) => refuse(MoveRole::Target, why),
        None => begun(start),
    }
}

/// An `--abort`'s restore of the source: it waits for the source's leaders.
const SOURCE_BACK: Step = Step::RestoreSource { wait_leading: true };

/// Every controller back, the source's first (it still owns what was not moved), after
/// the ClusterClasses of other namespaces that clusterctl paused are unpaused.
fn next_abort(b: &Begun, at: AbortAt, record: Option<&MoveRecord>, seen: &Observed) -> Step {
    match at {
        AbortAt::Begun if record.is_some() => Step::BeginAbort,
        AbortAt::Begun | AbortAt::Recorded => Step::Lift(Lifting::Abort),
        AbortAt::Lifted => unpause_source(b, record, seen, true).unwrap_or(SOURCE_BACK),
        AbortAt::SourceUnpaused => SOURCE_BACK,
        AbortAt::SourceBack => Step::RestoreTarget,
        AbortAt::TargetBack => Step::Aborted {
            recorded: record.is_some(),
        },
        AbortAt::Aborted => Step::Uninstall,
        AbortAt::Uninstalled => Step::Done,
    }
}

/// The ClusterClasses clusterctl paused and left in the source, unpaused once; no step where
/// it left none (the common case: a namespace whose Clusters use classes of their own).
fn unpause_source(
    b: &Begun,
    record: Option<&MoveRecord>,
    seen: &Observed,
    elsewhere_only: bool,
) -> Option<Step> {
    let classes = record
        .map(|r| {
            move_plan::classes_to_unpause(
                &b.namespace,
                &r.cluster_classes,
                seen.classes(),
                elsewhere_only,
            )
        })
        .unwrap_or_default();
    (!classes.is_empty()).then_some(Step::UnpauseSource(classes))
}

/// A move whose clusterctl succeeded, in this run or an earlier one: the target's Clusters
/// unpaused where clusterctl did not get to it, recorded as copied, the source's
/// ClusterClasses that clusterctl paused and left there unpaused, then the restore, the
/// target's controllers first (the namespace is theirs now).
fn next_restore(b: &Begun, at: FinishAt, record: Option<&MoveRecord>, seen: &Observed) -> Step {
    match at {
        FinishAt::Begun if b.start == Start::FinishTarget => {
            let moved = record.map(|r| r.clusters.as_slice()).unwrap_or_default();
            Step::UnpauseTarget(
                seen.target()
                    .iter()
                    .filter(|c| c.paused && moved.contains(&c.key))
                    .map(|c| c.key.clone())
                    .collect(),
            )
        }
        FinishAt::Begun | FinishAt::TargetUnpaused => Step::Copied,
        FinishAt::Copied => unpause_source(b, record, seen, false).unwrap_or(Step::RestoreTarget),
        FinishAt::SourceUnpaused => Step::RestoreTarget,
        FinishAt::TargetBack => Step::RestoreSource {
            wait_leading: false,
        },
        FinishAt::SourceBack => Step::Finish,
        FinishAt::Finished => Step::Uninstall,
        FinishAt::Uninstalled => Step::Done,
    }
}

/// A move from its checks to clusterctl's start.
fn next_move(
    asked: &Asked,
    b: &Begun,
    at: &MoveAt,
    record: Option<&MoveRecord>,
    seen: &Observed,
) -> Step {
    let source_stopped = b.start == Start::ResumeStopped;
    match at {
        MoveAt::Begun => check(seen),
        MoveAt::Checked if b.start != Start::Fresh => {
            let Some(r) = record else {
                return refuse(MoveRole::Target, Refusal::RecordGone(asked.window.clone()));
            };
            let unpause = unpause_for_clusterctl(r, seen);
            match source_stopped {
                true => Step::KeepSourceStopped { unpause },
                false => Step::PutSourceBack {
                    close_window: seen.source_open(),
                    unpause,
                },
            }
        }
        MoveAt::Checked | MoveAt::SourcePrepared => take_target(asked, b, seen, source_stopped),
        MoveAt::TargetTaken(_) if source_stopped => Step::ProveTarget,
        MoveAt::TargetTaken(b) | MoveAt::TargetProven(b) => Step::Hold {
            block_move: b.clone(),
        },
        MoveAt::Held => Step::StartClusterctl {
            watch_pause: !source_stopped,
        },
    }
}

/// While clusterctl runs: the source stopped once it paused it, then its end awaited; a
/// signal passed on to it as it comes.
fn next_in_span(b: &Begun, span: &Span) -> Step {
    match &span.at {
        SpanAt::Started if span.copying => Step::AwaitClusterctl,
        SpanAt::Started => Step::AwaitPause,
        SpanAt::Paused(keys) => Step::StopSource {
            paused: keys.clone(),
        },
        SpanAt::SourceTaken => Step::ProveStopped,
        SpanAt::Proven => Step::Lift(Lifting::Copy),
        SpanAt::Copying | SpanAt::Signalled => Step::AwaitClusterctl,
        SpanAt::Signalling(signal, because) => Step::SignalClusterctl {
            signal: *signal,
            because: because.clone(),
        },
        SpanAt::Exited(status) => Step::ClusterctlExited {
            status: status.clone(),
            // Where the source was not stopped before: clusterctl did not wait for handoff's
            // block-move (does it honour it?), and neither cluster was proven stopped.
            unheld: status.code == Some(0)
                && !span.copying
                && span.stopped.is_none()
                && b.start != Start::ResumeStopped,
        },
    }
}

/// clusterctl refuses to start while a Cluster or ClusterClass it would move is paused
/// (v1.12+), a ClusterClass of another namespace included; every Cluster (or, in a namespace
/// of ClusterClasses alone, every class) gets handoff's block-move, or nothing would hold
/// clusterctl's copy until the source is stopped (unless it is stopped already).
fn take_target(asked: &Asked, b: &Begun, seen: &Observed, source_stopped: bool) -> Step {
    if let Some(why) = move_plan::paused_before(seen.source(), seen.classes()) {
        return refuse(MoveRole::Source, why);
    }
    let stop_target = |block_move| Step::StopTarget {
        block_move,
        standbys_first: !source_stopped,
        keep_stop_times: b.start != Start::Fresh,
    };
    match source_stopped {
        true => stop_target(BlockMoveOn::default()),
        false => match move_plan::add_block_move(
            &b.namespace,
            seen.source(),
            seen.classes(),
            seen.class_users(),
            &asked.window,
        ) {
            Ok(block_move) => stop_target(block_move),
            Err(e) => refuse(MoveRole::Source, e),
        },
    }
}

#[cfg(test)]
mod tests;
