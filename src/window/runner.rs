//! The one loop every planned command runs on: read what the planner needs, ask it for the
//! next step, publish the step's name (the progress event, the `-v` line, the User-Agent of
//! every request it sends), perform it, and tell the planner what it came to; again, until the
//! planner ends the run. kubeadm's workflow runner and the KCP reconciler are the models: the
//! order of steps is the planner's, what a step does is the performer's, and this file is the
//! only place that publishes a step.
//!
//! It is also the one place that waits on a step, the child process a step started
//! (clusterctl) and SIGINT/SIGTERM together: a step the planner says may be cut is dropped at
//! its next await when either comes, any other runs to its end and the planner hears of it
//! after. Which signals are caught, held or left to their default is the planner's
//! (`Planner::catch`), turn by turn.

use crate::window::child::{Child, Signals};
use crate::window::plan::planner::{Catch, Interrupt, Observation, Planner, Verdict};
use crate::window::progress::Progress;
use crate::window::user_agent::StepLabel;

/// The I/O half of a command: it reads and performs, and decides nothing.
#[allow(async_fn_in_trait)] // driven on the caller's task, never spawned: no Send bound wanted
pub trait Performer<P: Planner> {
    type Error: std::fmt::Display + From<CannotCatch>;

    /// What `next` needs read, beside what this run reached (the planner says what, through
    /// a pure function of its own that this calls).
    async fn read(&mut self, planner: &P, reached: &P::Reached) -> Result<P::Read, Self::Error>;
    async fn perform(&mut self, step: &P::Step, read: &P::Read) -> Result<P::Found, Self::Error>;
    fn progress(&mut self) -> &mut Progress;
    /// A child process the last step started, for the runner to wait on from now on.
    fn started(&mut self) -> Option<Child> {
        None
    }
}

/// SIGINT and SIGTERM could not be caught where the planner needs them caught.
#[derive(Debug, thiserror::Error)]
#[error("cannot catch SIGINT and SIGTERM: {0}")]
pub struct CannotCatch(#[from] std::io::Error);

/// Where a run's steps are published: a command the user ran names its requests
/// (`(move step StopTarget)`); a command run inside another's step leaves that step's name on
/// them.
#[derive(Clone, Copy)]
pub enum Publish<'a> {
    Top(&'a StepLabel),
    Nested,
}

/// What the runner waits on beside the step.
#[derive(Default)]
struct Watch {
    signals: Option<Signals>,
    catch: Option<Catch>,
    child: Option<Child>,
}

impl Watch {
    /// Catch, hold or release the signals as the planner says for the next step.
    fn apply(&mut self, catch: Catch) -> Result<(), CannotCatch> {
        match catch {
            Catch::Default => {
                if let Some(s) = self.signals.take() {
                    s.release();
                }
            }
            Catch::Hold | Catch::Deliver if self.signals.is_none() => {
                self.signals = Some(Signals::catch()?);
            }
            Catch::Hold | Catch::Deliver => {}
        }
        self.catch = Some(catch);
        Ok(())
    }

    fn delivering(&self) -> bool {
        self.catch == Some(Catch::Deliver) && self.signals.is_some()
    }

    /// A signal caught before now, where it is to be handed over.
    fn pending(&mut self) -> Option<Interrupt> {
        match self.delivering() {
            true => self.signals.as_mut()?.pending().map(Interrupt::Signal),
            false => None,
        }
    }

    /// The next interrupt: a signal where they are delivered, or the child's end.
    async fn next(&mut self) -> Interrupt {
        let delivering = self.delivering();
        let signal = async {
            match (&mut self.signals, delivering) {
                (Some(s), true) => s.next().await,
                _ => std::future::pending().await,
            }
        };
        let exit = async {
            match &mut self.child {
                Some(c) => c.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            sig = signal => Interrupt::Signal(sig),
            status = exit => {
                self.child = None;
                // A wait that failed is an end we cannot describe.
                Interrupt::Exited(status.unwrap_or(crate::window::plan::planner::ExitStatus { code: None, signal: None }))
            }
        }
    }
}

/// Run `planner` to its end with `x`: what the run reached, or the error of the step that
/// ended it.
pub async fn run<P: Planner, X: Performer<P>>(
    planner: &P,
    x: &mut X,
    publish: Publish<'_>,
) -> Result<P::Reached, X::Error> {
    let mut reached = P::Reached::default();
    let mut watch = Watch::default();
    loop {
        // Caught while held, or while the last step ran: the planner hears of it before it
        // names the next step (and may then want the signals otherwise).
        watch.apply(planner.catch(&reached))?;
        while let Some(i) = watch.pending() {
            planner.interrupted(&mut reached, i);
            watch.apply(planner.catch(&reached))?;
        }
        let read = x.read(planner, &reached).await?;
        let step = planner.next(&read, &reached);
        let name = P::name(&step);
        x.progress().step(planner.of(), name);
        if let Publish::Top(label) = publish {
            label.set(planner.of(), name);
        }
        let cuttable = P::cuttable(&step);
        let mut after = Vec::new();
        let ran = {
            let perform = x.perform(&step, &read);
            tokio::pin!(perform);
            loop {
                tokio::select! {
                    biased;
                    r = &mut perform => break Ok(r),
                    i = watch.next() => {
                        if cuttable {
                            break Err(i);
                        }
                        after.push(i);
                    }
                }
            }
        };
        if let Some(child) = x.started() {
            watch.child = Some(child);
        }
        let verdict = match ran {
            Ok(Ok(found)) => planner.observe(&mut reached, &step, Observation::Done(found)),
            Ok(Err(e)) => match planner.observe(&mut reached, &step, Observation::Failed(&e)) {
                Verdict::End => return Err(e),
                Verdict::GoOn => Verdict::GoOn,
            },
            Err(i) => planner.observe(&mut reached, &step, Observation::Cut(i)),
        };
        if verdict == Verdict::End {
            return Ok(reached);
        }
        for i in after {
            planner.interrupted(&mut reached, i);
        }
    }
}

#[cfg(test)]
mod tests;
