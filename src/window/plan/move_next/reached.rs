//! What a run of `handoff move` has reached, as one position on one path: a run that resumes
//! cannot have taken the target before it checked, an `--abort` cannot have held clusterctl,
//! and a restore cannot have brought the source back before the target. `Run`'s fifteen
//! fields could say all of these; a `Reached` cannot.

use super::{Because, Found, Lifting, Outcome, Step};
use crate::window::plan::move_plan::{BlockMoveOn, Start};
use crate::window::plan::planner::{ExitStatus, Interrupt};

/// What this run has done: nothing yet, or begun on one namespace along one path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Reached {
    #[default]
    New,
    Begun(Begun),
}

/// A run once it has begun: the namespace it acts on (the one place that says it from here on:
/// an `--abort` acts on the recorded move's, whatever `--namespace` says), how it began, and
/// where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begun {
    pub namespace: String,
    pub start: Start,
    pub path: Path,
}

impl Begun {
    /// Where a run that begins as `start` is, before its first step after `Begin`.
    pub fn new(namespace: &str, start: Start, abort: bool) -> Begun {
        let path = match (&start, abort) {
            (Start::Tidy, _) => Path::Tidy { uninstalled: false },
            (_, true) => Path::Abort(AbortAt::Begun),
            (Start::RestoreOnly | Start::FinishTarget, false) => Path::Finish(FinishAt::Begun),
            (Start::Fresh | Start::Resume | Start::ResumeStopped, false) => {
                Path::Move(MoveAt::Begun)
            }
        };
        Begun {
            namespace: namespace.to_string(),
            start,
            path,
        }
    }
}

/// The paths a run takes. A move ends clusterctl's part (`Ended`), lifts the block-move, and
/// goes on to `Finish` or to `Failing`; a run that finds clusterctl done starts on `Finish`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// From the checks to clusterctl's start.
    Move(MoveAt),
    /// While clusterctl runs.
    Clusterctl(Span),
    /// clusterctl exited, or handoff stopped once the block-move could be on: lifted next.
    Ended(Outcome),
    /// clusterctl failed or handoff stopped, the block-move lifted: recorded next, and the end.
    Failing(Outcome),
    /// clusterctl moved everything: the restore, the target's controllers first.
    Finish(FinishAt),
    /// An `--abort`: the source's controllers first.
    Abort(AbortAt),
    /// The move was done already: what it brought along removed.
    Tidy { uninstalled: bool },
}

/// A move's position before clusterctl runs; the target's taking carries where handoff's
/// block-move goes, until `Hold` puts it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveAt {
    Begun,
    Checked,
    /// A resumed move's source put back as clusterctl expects it, or kept stopped.
    SourcePrepared,
    TargetTaken(BlockMoveOn),
    /// Proven before clusterctl starts: only where the source is stopped already.
    TargetProven(BlockMoveOn),
    Held,
}

/// clusterctl's run: where it is, and what the run knows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub at: SpanAt,
    /// clusterctl may copy: the source stopped and proven, the block-move lifted (or the
    /// source stopped before clusterctl started).
    pub copying: bool,
    /// Why handoff stopped clusterctl, where it did: the run's outcome, whatever clusterctl
    /// exits with.
    pub stopped: Option<String>,
    /// A signal handoff caught was passed on to clusterctl.
    pub interrupted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanAt {
    /// Started; the source's pause awaited (or, where the source is stopped, its end).
    Started,
    /// clusterctl paused these source Clusters: the source is stopped next.
    Paused(Vec<String>),
    /// The source's controllers taken: both clusters are proven stopped next.
    SourceTaken,
    /// Both proven stopped, `Copying` recorded: handoff's block-move is lifted next.
    Proven,
    /// Copying: its end awaited.
    Copying,
    /// This signal is to be passed on, for this reason.
    Signalling(i32, Because),
    /// Signalled: its end awaited.
    Signalled,
    /// It ended.
    Exited(ExitStatus),
}

impl Span {
    /// How clusterctl's part ended, once it exited.
    fn outcome(&self, status: &ExitStatus) -> Outcome {
        match (&self.stopped, status.code) {
            (Some(why), _) => Outcome::Stopped(format!("handoff move stopped: {why}")),
            (None, Some(0)) => Outcome::Moved,
            (None, code) => Outcome::Exited {
                exit: code.unwrap_or(-1),
                what: format!(
                    "clusterctl move exited {}{}",
                    status.describe(),
                    match self.interrupted {
                        true => " (handoff was interrupted and passed the signal on)",
                        false => "",
                    }
                ),
            },
        }
    }
}

/// A restore's position, in order; an optional step (an unpause) is skipped by going past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FinishAt {
    Begun,
    TargetUnpaused,
    /// The move recorded as copied (`Restoring`).
    Copied,
    /// What clusterctl paused and left in the source unpaused.
    SourceUnpaused,
    TargetBack,
    SourceBack,
    Finished,
    /// What the windows brought along removed (`installed::remove`).
    Uninstalled,
}

/// An `--abort`'s position, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AbortAt {
    Begun,
    /// The abort recorded (`Aborting`): where a move was recorded.
    Recorded,
    Lifted,
    SourceUnpaused,
    SourceBack,
    TargetBack,
    Aborted,
    Uninstalled,
}

impl Reached {
    pub fn begun(&self) -> Option<&Begun> {
        match self {
            Reached::New => None,
            Reached::Begun(b) => Some(b),
        }
    }

    /// The source could not be stopped: clusterctl is stopped before it copies anything, and
    /// that is the run's outcome.
    pub fn source_not_stopped(&mut self, why: String) {
        if let Some(span) = self.span() {
            span.at = SpanAt::Signalling(libc::SIGTERM, Because::Stopped(why.clone()));
            span.stopped = Some(why);
        }
    }

    /// A signal (where they are delivered) or clusterctl's end, between steps or cutting one.
    /// Before clusterctl starts, a signal stops the move (the block-move is on: lifted next).
    pub fn interrupted(&mut self, i: Interrupt) {
        if let (Some(Begun { path, .. }), Interrupt::Signal(sig)) = (self.begun(), &i)
            && *path == Path::Move(MoveAt::Held)
        {
            self.ended(Outcome::Stopped(format!(
                "handoff move stopped: source: interrupted (signal {sig}) before clusterctl started"
            )));
            return;
        }
        let Some(span) = self.span() else {
            return;
        };
        match i {
            Interrupt::Exited(status) => span.at = SpanAt::Exited(status),
            // Gone: nothing to pass it on to.
            Interrupt::Signal(_) if matches!(span.at, SpanAt::Exited(_)) => {}
            Interrupt::Signal(sig) => {
                span.at = SpanAt::Signalling(
                    sig,
                    Because::Interrupted {
                        copying: span.copying,
                    },
                )
            }
        }
    }

    fn span(&mut self) -> Option<&mut Span> {
        match self {
            Reached::Begun(Begun {
                path: Path::Clusterctl(span),
                ..
            }) => Some(span),
            _ => None,
        }
    }

    /// clusterctl's part over: what it did, or why handoff stopped (a step from the block-move
    /// on failed: `Step::fails_into_outcome`).
    pub fn ended(&mut self, outcome: Outcome) {
        let Reached::Begun(b) = self else {
            panic!("the move's planner: clusterctl's part ended before the run began");
        };
        b.path = Path::Ended(outcome);
    }

    /// Where this run is once `step` was performed. A step `next` does not give from here is
    /// the planner's bug, and stops the run at once rather than record a position it is not at.
    pub fn performed(&mut self, step: &Step, found: Found) {
        if let Step::Begin(b) = step {
            *self = Reached::Begun(b.clone());
            return;
        }
        if matches!(step, Step::Refuse { .. } | Step::Fail(_) | Step::Done) {
            return;
        }
        let Reached::Begun(b) = self else {
            panic!("the move's planner: {step:?} performed before the run began");
        };
        let at = match (&b.path, step) {
            (Path::Move(MoveAt::Held), Step::StartClusterctl { watch_pause }) => {
                Path::Clusterctl(Span {
                    at: SpanAt::Started,
                    copying: !watch_pause,
                    stopped: None,
                    interrupted: false,
                })
            }
            (Path::Clusterctl(span), step) => span_after(span, step, found),
            (Path::Move(MoveAt::Begun), Step::Check { .. }) => Path::Move(MoveAt::Checked),
            (
                Path::Move(MoveAt::Checked),
                Step::PutSourceBack { .. } | Step::KeepSourceStopped { .. },
            ) => Path::Move(MoveAt::SourcePrepared),
            (
                Path::Move(MoveAt::Checked | MoveAt::SourcePrepared),
                Step::StopTarget { block_move, .. },
            ) => Path::Move(MoveAt::TargetTaken(block_move.clone())),
            (Path::Move(MoveAt::TargetTaken(b)), Step::ProveTarget) => {
                Path::Move(MoveAt::TargetProven(b.clone()))
            }
            (Path::Move(MoveAt::TargetTaken(_) | MoveAt::TargetProven(_)), Step::Hold { .. }) => {
                Path::Move(MoveAt::Held)
            }
            (Path::Ended(Outcome::Moved), Step::Lift(_)) => Path::Finish(FinishAt::Begun),
            (Path::Ended(why), Step::Lift(_)) => Path::Failing(why.clone()),
            (Path::Finish(at), step) => Path::Finish(later(*at, finish_at(step), step)),
            (Path::Abort(at), step) => Path::Abort(later(*at, abort_at(step), step)),
            (Path::Tidy { .. }, Step::Uninstall) => Path::Tidy { uninstalled: true },
            (path, step) => {
                panic!("the move's planner: {step:?} performed at {path:?}, which it never follows")
            }
        };
        b.path = at;
    }
}

/// Where clusterctl's run is after `step`.
fn span_after(span: &Span, step: &Step, found: Found) -> Path {
    let mut span = span.clone();
    match (&span.at, step, found) {
        (SpanAt::Started, Step::AwaitPause, Found::SourcePaused(keys)) => {
            span.at = SpanAt::Paused(keys)
        }
        (SpanAt::Paused(_), Step::StopSource { .. }, _) => span.at = SpanAt::SourceTaken,
        (SpanAt::SourceTaken, Step::ProveStopped, _) => span.at = SpanAt::Proven,
        (SpanAt::Proven, Step::Lift(Lifting::Copy), _) => {
            span.at = SpanAt::Copying;
            span.copying = true;
        }
        (SpanAt::Signalling(_, because), Step::SignalClusterctl { .. }, _) => {
            span.interrupted |= matches!(because, Because::Interrupted { .. });
            span.at = SpanAt::Signalled;
        }
        (SpanAt::Exited(status), Step::ClusterctlExited { .. }, _) => {
            return Path::Ended(span.outcome(status));
        }
        (at, step, found) => panic!(
            "the move's planner: {step:?} performed (found {found:?}) at {at:?}, which it never follows"
        ),
    }
    Path::Clusterctl(span)
}

/// The restore's position `step` reaches.
fn finish_at(step: &Step) -> Option<FinishAt> {
    Some(match step {
        Step::UnpauseTarget(_) => FinishAt::TargetUnpaused,
        Step::Copied => FinishAt::Copied,
        Step::UnpauseSource(_) => FinishAt::SourceUnpaused,
        Step::RestoreTarget => FinishAt::TargetBack,
        Step::RestoreSource { .. } => FinishAt::SourceBack,
        Step::Finish => FinishAt::Finished,
        Step::Uninstall => FinishAt::Uninstalled,
        _ => return None,
    })
}

/// The `--abort`'s position `step` reaches.
fn abort_at(step: &Step) -> Option<AbortAt> {
    Some(match step {
        Step::BeginAbort => AbortAt::Recorded,
        Step::Lift(_) => AbortAt::Lifted,
        Step::UnpauseSource(_) => AbortAt::SourceUnpaused,
        Step::RestoreSource { .. } => AbortAt::SourceBack,
        Step::RestoreTarget => AbortAt::TargetBack,
        Step::Aborted { .. } => AbortAt::Aborted,
        Step::Uninstall => AbortAt::Uninstalled,
        _ => return None,
    })
}

/// A path in order only goes on: a step of another path, or one back, is the planner's bug.
fn later<A: Ord + std::fmt::Debug>(at: A, to: Option<A>, step: &Step) -> A {
    match to {
        Some(to) if to > at => to,
        _ => panic!("the move's planner: {step:?} performed at {at:?}, which it never follows"),
    }
}

/// Whether a read was made: an unread list is not an empty one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Seen<T> {
    #[default]
    NotRead,
    Read(T),
}

impl<T> Seen<T> {
    /// What was read. The planner looking at what `reads` did not ask for is its own bug,
    /// which the walk tests find: they give it only what `reads` asked for.
    pub fn get(&self, what: &str) -> &T {
        match self {
            Seen::Read(t) => t,
            Seen::NotRead => {
                panic!("the move's planner used {what}, which `reads` did not ask for")
            }
        }
    }
}
