//! `handoff window open` and `close`, one next step at a time, pure, in the shape of
//! `move_next`: from each cluster's window as read when the run began and what this run has
//! done, the single thing to do next. The drivers (`open`, `close`) perform it and come back.
//! `handoff move` runs the same drivers inside its own steps (`StopTarget` takes the target,
//! `RunClusterctl` the source once clusterctl paused it, `RestoreTarget` and `RestoreSource`
//! close them), so a window opened by a move and one opened by hand go through the same steps.

use crate::resources::move_window::MoveWindow;
use crate::resources::phase::{UnknownPhase, WindowPhase};
use crate::window::plan::declare::{Of, steps};
use crate::window::plan::planner::{Observation, Planner, Verdict};

/// One cluster's window as read before the run's first step (the run's own writes are in
/// what it performed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No window of that name.
    Absent,
    /// The window and its recorded phase (none: created by hand, or by a version before
    /// phases were recorded).
    At(Option<WindowPhase>),
}

impl Seen {
    /// As read: the window, or none.
    pub fn of(window: Option<&MoveWindow>) -> Seen {
        match window {
            None => Seen::Absent,
            Some(w) => Seen::At(w.status.as_ref().and_then(|s| s.phase.clone())),
        }
    }
}

steps! {
/// One step of `window open`; `usize` is the cluster's place in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenStep names OpenStepName {
    /// Stop, writing nothing, and say which cluster refused and why.
    Refuse { cluster: usize, why: WindowRefusal },
    /// Choose how each selected Deployment is stopped, the preflight, and who takes the
    /// Leases, on every cluster; nothing written.
    Check,
    /// The window created or re-opened and set Open, what is Lease-stopped recorded, the pin's
    /// policies bound.
    Record {
        cluster: usize,
        /// A new opening, so what an earlier one recorded of its pods no longer holds.
        fresh: bool,
    },
    /// Pin the Scale-stopped Deployments, add the standbys, take the Leases.
    Stop(usize),
    /// Every cluster at once: wait until the former leaders cannot lead, check the Leases are
    /// still the window's and the webhooks serve, the pinned pods gone; record the window Open.
    Prove,
    /// Nothing left to do.
    Done,
}
}

steps! {
/// One step of `window close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseStep names CloseStepName {
    /// Stop, writing nothing, and say which cluster refused (or that all did) and why.
    Refuse {
        cluster: Option<usize>,
        why: WindowRefusal,
    },
    /// The window set Closed and unbound.
    MarkClosed {
        cluster: usize,
        /// Its phase was Closed already, and stays so.
        closed_before: bool,
    },
    /// Every Scale-stopped Deployment back to its count.
    RestoreScaled(usize),
    /// Every held Lease released, each controller leading again.
    ReleaseLeases(usize),
    /// The window recorded Closed.
    RecordClosed(usize),
    /// No window there: release any Lease still labelled as its (a window deleted unclosed).
    ReleaseOrphans(usize),
    /// Nothing left to do.
    Done,
}
}

/// What a `close` has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloseRun {
    pub performed: Vec<CloseStep>,
    /// The clusters where `ReleaseOrphans` found no Lease of the window either.
    pub nothing_here: Vec<usize>,
}

/// Why `window open` or `window close` refuses: kept typed to the command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowRefusal {
    #[error(transparent)]
    Unknown(#[from] UnknownPhase),
    #[error("there is no MoveWindow {0}: nothing to close")]
    Nowhere(String),
}

/// A phase written by a version this one does not know: acting on it could undo what that
/// version relies on, so nothing is written. The cluster and why.
fn unknown(window: &str, seen: &[Seen]) -> Option<(usize, WindowRefusal)> {
    seen.iter().enumerate().find_map(|(i, s)| match s {
        Seen::At(Some(p)) => p.known(window).err().map(|e| (i, e.into())),
        _ => None,
    })
}

/// `window open`'s next step (`prove`: wait for the proof; `handoff move` takes first and
/// proves once clusterctl has paused the source). Every window exists and is open before any
/// Deployment is stopped anywhere, so a cluster that fails on the way leaves no controller
/// stopped without a window to close; the proof waits for every cluster at once.
pub fn next_open(prove: bool, window: &str, seen: &[Seen], performed: &[OpenStep]) -> OpenStep {
    if let Some((cluster, why)) = unknown(window, seen) {
        return OpenStep::Refuse { cluster, why };
    }
    let did = |step: &OpenStep| performed.contains(step);
    if !did(&OpenStep::Check) {
        return OpenStep::Check;
    }
    for (i, s) in seen.iter().enumerate() {
        // Where it was opening or open, this is the same opening resumed.
        let fresh = !matches!(s, Seen::At(Some(WindowPhase::Opening | WindowPhase::Open)));
        let step = OpenStep::Record { cluster: i, fresh };
        if !did(&step) {
            return step;
        }
    }
    if let Some(i) = (0..seen.len()).find(|i| !did(&OpenStep::Stop(*i))) {
        return OpenStep::Stop(i);
    }
    if prove && !did(&OpenStep::Prove) {
        return OpenStep::Prove;
    }
    OpenStep::Done
}

/// `window close`'s next step. Each cluster is closed in the order given, all of it before
/// the next (a move's restore puts the target first): its Scale-stopped controllers back
/// before its Leases are released, since a leader may need the others' webhooks.
pub fn next_close(window: &str, seen: &[Seen], run: &CloseRun) -> CloseStep {
    if let Some((cluster, why)) = unknown(window, seen) {
        return CloseStep::Refuse {
            cluster: Some(cluster),
            why,
        };
    }
    for (i, s) in seen.iter().enumerate() {
        let steps = match s {
            Seen::Absent => vec![CloseStep::ReleaseOrphans(i)],
            Seen::At(phase) => vec![
                CloseStep::MarkClosed {
                    cluster: i,
                    closed_before: *phase == Some(WindowPhase::Closed),
                },
                CloseStep::RestoreScaled(i),
                CloseStep::ReleaseLeases(i),
                CloseStep::RecordClosed(i),
            ],
        };
        if let Some(step) = steps.into_iter().find(|s| !run.performed.contains(s)) {
            return step;
        }
    }
    // A cluster without the window (an `open` that died before creating it there) does not
    // stop the others from closing; a name that exists nowhere is an error.
    if !seen.is_empty() && run.nothing_here.len() == seen.len() {
        return CloseStep::Refuse {
            cluster: None,
            why: WindowRefusal::Nowhere(window.to_string()),
        };
    }
    CloseStep::Done
}

/// `window open`'s planner, for the runner: each cluster's window as read before the first
/// step (nothing is read between steps: the run's own writes are in what it performed).
pub struct OpenPlanner {
    /// Wait for the proof (`window open`), or leave it to the caller (`handoff move`).
    pub prove: bool,
    pub window: String,
    pub seen: Vec<Seen>,
}

impl Planner for OpenPlanner {
    type Step = OpenStep;
    type Name = OpenStepName;
    type Read = ();
    type Reached = Vec<OpenStep>;
    type Found = ();
    fn of(&self) -> Of {
        Of::WindowOpen
    }

    fn name(step: &OpenStep) -> OpenStepName {
        step.name()
    }

    fn next(&self, _: &(), performed: &Vec<OpenStep>) -> OpenStep {
        next_open(self.prove, &self.window, &self.seen, performed)
    }

    fn observe(
        &self,
        performed: &mut Vec<OpenStep>,
        step: &OpenStep,
        o: Observation<'_, ()>,
    ) -> Verdict {
        match (step, o) {
            (OpenStep::Done, _) | (_, Observation::Failed(_)) => Verdict::End,
            // Never: no step of it may be cut (`cuttable`); one cut would be given again.
            (_, Observation::Cut(_)) => Verdict::GoOn,
            (_, Observation::Done(())) => {
                performed.push(step.clone());
                Verdict::GoOn
            }
        }
    }
}

/// What a step of `window close` found that the planner needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseFound {
    Did,
    /// `ReleaseOrphans` found no Lease of the window either.
    NothingHere,
}

/// `window close`'s planner, for the runner.
pub struct ClosePlanner {
    pub window: String,
    pub seen: Vec<Seen>,
}

impl Planner for ClosePlanner {
    type Step = CloseStep;
    type Name = CloseStepName;
    type Read = ();
    type Reached = CloseRun;
    type Found = CloseFound;
    fn of(&self) -> Of {
        Of::WindowClose
    }

    fn name(step: &CloseStep) -> CloseStepName {
        step.name()
    }

    fn next(&self, _: &(), run: &CloseRun) -> CloseStep {
        next_close(&self.window, &self.seen, run)
    }

    fn observe(
        &self,
        run: &mut CloseRun,
        step: &CloseStep,
        o: Observation<'_, CloseFound>,
    ) -> Verdict {
        match (step, o) {
            (CloseStep::Done, _) | (_, Observation::Failed(_)) => Verdict::End,
            // Never, as for `OpenPlanner`.
            (_, Observation::Cut(_)) => Verdict::GoOn,
            (CloseStep::ReleaseOrphans(i), Observation::Done(CloseFound::NothingHere)) => {
                run.nothing_here.push(*i);
                run.performed.push(step.clone());
                Verdict::GoOn
            }
            (_, Observation::Done(_)) => {
                run.performed.push(step.clone());
                Verdict::GoOn
            }
        }
    }
}

#[cfg(test)]
mod tests;
