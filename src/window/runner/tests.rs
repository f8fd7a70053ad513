use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::window::plan::declare::{Of, steps};
use crate::window::plan::planner::{ExitStatus, Interrupt};
use crate::window::progress::{Format, Said};

steps! {
/// A toy command's steps.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Toy names ToyName {
    /// Writes its number.
    Write(u32),
    /// Fails.
    Break,
    /// Ends the run.
    Done,
}
}

/// Two writes, a failure (absorbed where `absorb`), and done.
struct ToyPlanner {
    absorb: bool,
}

impl Planner for ToyPlanner {
    type Step = Toy;
    type Name = ToyName;
    type Read = u32;
    type Reached = Vec<String>;
    type Found = ();
    fn of(&self) -> Of {
        Of::Move
    }

    fn name(step: &Toy) -> ToyName {
        step.name()
    }

    fn next(&self, read: &u32, reached: &Vec<String>) -> Toy {
        match reached.len() {
            0 | 1 => Toy::Write(*read),
            2 => Toy::Break,
            _ => Toy::Done,
        }
    }

    fn observe(&self, reached: &mut Vec<String>, step: &Toy, o: Observation<'_, ()>) -> Verdict {
        match (step, o) {
            (Toy::Done, Observation::Done(())) => Verdict::End,
            (_, Observation::Done(())) => {
                reached.push(format!("{step:?}"));
                Verdict::GoOn
            }
            (_, Observation::Failed(e)) if self.absorb => {
                reached.push(format!("absorbed: {e}"));
                Verdict::GoOn
            }
            (_, Observation::Failed(_)) => Verdict::End,
            (_, Observation::Cut(i)) => panic!("no toy step may be cut: {i:?}"),
        }
    }
}

/// Notes each call, with the User-Agent a request sent while performing would carry.
struct ToyPerformer {
    calls: Rc<RefCell<Vec<String>>>,
    label: StepLabel,
    out: Progress,
    reads: u32,
}

#[derive(Debug, PartialEq)]
struct ToyError(String);

impl std::fmt::Display for ToyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<CannotCatch> for ToyError {
    fn from(e: CannotCatch) -> ToyError {
        ToyError(e.to_string())
    }
}

impl Performer<ToyPlanner> for ToyPerformer {
    type Error = ToyError;

    async fn read(&mut self, _: &ToyPlanner, reached: &Vec<String>) -> Result<u32, ToyError> {
        self.calls
            .borrow_mut()
            .push(format!("read after {}", reached.len()));
        self.reads += 1;
        Ok(self.reads)
    }

    async fn perform(&mut self, step: &Toy, read: &u32) -> Result<(), ToyError> {
        let ua = self.label.user_agent();
        let said = ua.split_once(" (").map_or("", |(_, s)| s);
        self.calls
            .borrow_mut()
            .push(format!("perform {step:?} of read {read} ({said}"));
        match step {
            Toy::Break => Err(ToyError("it broke".into())),
            _ => Ok(()),
        }
    }

    fn progress(&mut self) -> &mut Progress {
        &mut self.out
    }
}

fn toy(label: &StepLabel) -> (ToyPerformer, Rc<RefCell<Vec<String>>>, Said) {
    let calls = Rc::new(RefCell::new(Vec::new()));
    let said = Said::default();
    let x = ToyPerformer {
        calls: calls.clone(),
        label: label.clone(),
        out: Progress::new(Box::new(said.clone()), Format::Text, true),
        reads: 0,
    };
    (x, calls, said)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

#[test]
fn each_turn_reads_then_publishes_then_performs_then_observes_and_done_is_published() {
    let label = StepLabel::default();
    let (mut x, calls, said) = toy(&label);
    let reached = block_on(run(
        &ToyPlanner { absorb: true },
        &mut x,
        Publish::Top(&label),
    ));
    assert_eq!(
        reached,
        Ok(vec![
            "Write(1)".to_string(),
            "Write(2)".to_string(),
            "absorbed: it broke".to_string()
        ])
    );
    // Each step performed with what was read for it, its name already on its requests.
    assert_eq!(
        *calls.borrow(),
        [
            "read after 0",
            "perform Write(1) of read 1 (move step Write)",
            "read after 1",
            "perform Write(2) of read 2 (move step Write)",
            "read after 2",
            "perform Break of read 3 (move step Break)",
            "read after 3",
            "perform Done of read 4 (move step Done)",
        ]
    );
    assert_eq!(
        said.text(),
        "move step: Write\nmove step: Write\nmove step: Break\nmove step: Done\n"
    );
}

#[test]
fn a_failure_the_planner_ends_on_is_the_runs_error_and_nothing_runs_after_it() {
    let label = StepLabel::default();
    let (mut x, calls, said) = toy(&label);
    let ended = block_on(run(
        &ToyPlanner { absorb: false },
        &mut x,
        Publish::Top(&label),
    ));
    assert_eq!(ended, Err(ToyError("it broke".into())));
    assert_eq!(
        calls.borrow().last().unwrap(),
        "perform Break of read 3 (move step Break)"
    );
    assert!(!said.text().contains("Done"), "{}", said.text());
}

#[test]
fn a_nested_run_publishes_its_steps_but_leaves_the_label_of_the_step_it_runs_in() {
    let label = StepLabel::default();
    label.set(Of::Move, ToyName::Write);
    let (mut x, calls, said) = toy(&label);
    block_on(run(&ToyPlanner { absorb: true }, &mut x, Publish::Nested)).expect("the toy run");
    assert!(
        calls
            .borrow()
            .iter()
            .filter(|c| c.starts_with("perform"))
            .all(|c| c.ends_with("(move step Write)")),
        "{:?}",
        calls.borrow()
    );
    assert!(said.text().contains("move step: Done"));
}

steps! {
/// A command that starts a child and waits on it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Waits names WaitsName {
    /// Starts the child.
    Start,
    /// Waits until cut.
    Wait,
    /// Sleeps a while, not to be cut.
    Busy,
    /// Ends the run.
    Done,
}
}

/// `Start`, then `order` (a `Busy` or a `Wait`), each once, then `Done`; what it hears is
/// noted in order.
struct Waiting {
    order: Vec<Waits>,
    catch: Catch,
}

impl Planner for Waiting {
    type Step = Waits;
    type Name = WaitsName;
    type Read = ();
    type Reached = Vec<String>;
    type Found = ();
    fn of(&self) -> Of {
        Of::Move
    }

    fn name(step: &Waits) -> WaitsName {
        step.name()
    }

    fn cuttable(step: &Waits) -> bool {
        *step == Waits::Wait
    }

    fn catch(&self, _: &Vec<String>) -> Catch {
        self.catch
    }

    fn next(&self, _: &(), heard: &Vec<String>) -> Waits {
        let done = heard.iter().filter(|h| h.starts_with("done")).count();
        match done {
            0 => Waits::Start,
            n => self.order.get(n - 1).cloned().unwrap_or(Waits::Done),
        }
    }

    fn observe(&self, heard: &mut Vec<String>, step: &Waits, o: Observation<'_, ()>) -> Verdict {
        match (step, o) {
            (Waits::Done, _) => return Verdict::End,
            (_, Observation::Done(())) => heard.push(format!("done {step:?}")),
            (_, Observation::Failed(e)) => heard.push(format!("failed {step:?}: {e}")),
            // A cut step counts as done here, so that the walk goes on.
            (_, Observation::Cut(i)) => heard.push(format!("done {step:?}, cut by {i:?}")),
        }
        Verdict::GoOn
    }

    fn interrupted(&self, heard: &mut Vec<String>, i: Interrupt) {
        heard.push(format!("then {i:?}"));
    }
}

/// Starts `sh -c <script>` and hands it over; `Busy` sleeps 300 ms (a step whose end the
/// child's must wait for), `Wait` never ends by itself.
struct Shell {
    script: &'static str,
    child: Option<Child>,
    out: Progress,
}

impl Performer<Waiting> for Shell {
    type Error = ToyError;

    async fn read(&mut self, _: &Waiting, _: &Vec<String>) -> Result<(), ToyError> {
        Ok(())
    }

    async fn perform(&mut self, step: &Waits, _: &()) -> Result<(), ToyError> {
        match step {
            Waits::Start => {
                let child = tokio::process::Command::new("sh")
                    .args(["-c", self.script])
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| ToyError(e.to_string()))?;
                self.child = Some(Child::from_tokio(child));
            }
            Waits::Busy => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
            Waits::Wait => std::future::pending().await,
            Waits::Done => {}
        }
        Ok(())
    }

    fn progress(&mut self) -> &mut Progress {
        &mut self.out
    }

    fn started(&mut self) -> Option<Child> {
        self.child.take()
    }
}

fn waiting(order: Vec<Waits>, catch: Catch, script: &'static str) -> Vec<String> {
    let mut x = Shell {
        script,
        child: None,
        out: Progress::new(Box::new(Said::default()), Format::Text, false),
    };
    block_on(run(&Waiting { order, catch }, &mut x, Publish::Nested)).expect("the run")
}

fn exited(code: i32) -> Interrupt {
    Interrupt::Exited(ExitStatus {
        code: Some(code),
        signal: None,
    })
}

#[test]
fn a_step_that_may_be_cut_is_cut_by_the_childs_end_and_one_that_may_not_hears_of_it_after() {
    assert_eq!(
        waiting(vec![Waits::Wait], Catch::Default, "exit 3"),
        [
            "done Start".to_string(),
            format!("done Wait, cut by {:?}", exited(3)),
        ]
    );
    // The child ends while `Busy` runs: `Busy` runs to its end, then the planner hears.
    assert_eq!(
        waiting(vec![Waits::Busy], Catch::Default, "exit 4"),
        [
            "done Start".to_string(),
            "done Busy".to_string(),
            format!("then {:?}", exited(4)),
        ]
    );
}

#[test]
fn a_signal_is_held_until_delivered_then_cuts_a_wait() {
    // SIGTERM to this test process, while the runner catches it: delivered, it cuts the wait
    // (the child, still sleeping, is killed as it is dropped).
    let heard = waiting(
        vec![Waits::Wait],
        Catch::Deliver,
        "kill -TERM $PPID; sleep 30",
    );
    assert_eq!(
        heard,
        [
            "done Start".to_string(),
            format!("done Wait, cut by {:?}", Interrupt::Signal(libc::SIGTERM)),
        ]
    );
}
