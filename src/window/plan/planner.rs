//! What a command's planner is to the runner (`runner::run`): pure. From what was read and
//! what this run reached, the one next step; from what the step did, where the run is now and
//! whether it goes on. No planner sees a cluster, a clock or a process: the performer reads
//! and writes, the runner publishes, and each decision is a function a table test can walk.

use crate::window::plan::declare::{Of, StepName};

/// What a performed step came to, as its planner hears it.
pub enum Observation<'a, F> {
    /// It ran to its end, and found `F` (what a later step needs; `()` for most).
    Done(F),
    /// It failed with this error (its message).
    Failed(&'a dyn std::fmt::Display),
    /// It was cut short by this (only a step its planner says may be: `cuttable`).
    Cut(Interrupt),
}

/// What the runner waits on beside a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interrupt {
    /// SIGINT or SIGTERM, where the planner has them delivered (`Catch::Deliver`).
    Signal(i32),
    /// The child a step started (clusterctl) ended.
    Exited(ExitStatus),
}

/// How a child process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitStatus {
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("with exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "without an exit code".into(),
        }
    }

    /// What handoff exits with: the child's code, or 1 when it had none (a signal).
    pub fn exit_code(&self) -> i32 {
        self.code.filter(|c| *c > 0).unwrap_or(1)
    }
}

/// What SIGINT and SIGTERM do from here on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Catch {
    /// What they do by default: end the process (what is left is recorded, and the same
    /// command finishes it).
    Default,
    /// Caught and kept, handed over once the planner says `Deliver`.
    Hold,
    /// Caught and handed to the planner: cutting a step that may be cut, or after one that
    /// may not.
    Deliver,
}

/// Whether the run goes on after a step: `End` after a step that did end it returns what the
/// run reached; after a failed one, the step's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    GoOn,
    End,
}

pub trait Planner {
    type Step: std::fmt::Debug;
    type Name: StepName;
    /// What the performer read for the next step.
    type Read;
    /// What this run has done so far; `Default` is a run that has done nothing.
    type Reached: Default;
    /// What a step finds for the planner.
    type Found;
    /// Whose steps these are, in progress events and User-Agents.
    fn of(&self) -> Of;

    fn name(step: &Self::Step) -> Self::Name;
    /// Whether `step` may be cut short by an interrupt: one that only waits, or whose writes
    /// the way out does again. Any other runs to its end, and hears of the interrupt after.
    fn cuttable(_step: &Self::Step) -> bool {
        false
    }
    /// What SIGINT and SIGTERM do while the next step runs.
    fn catch(&self, _reached: &Self::Reached) -> Catch {
        Catch::Default
    }
    fn next(&self, read: &Self::Read, reached: &Self::Reached) -> Self::Step;
    fn observe(
        &self,
        reached: &mut Self::Reached,
        step: &Self::Step,
        o: Observation<'_, Self::Found>,
    ) -> Verdict;
    /// An interrupt that came while a step that may not be cut ran (told after that step's
    /// own observation), or that was caught and held until the planner has them delivered
    /// (told before the next step).
    fn interrupted(&self, _reached: &mut Self::Reached, _i: Interrupt) {}
}
