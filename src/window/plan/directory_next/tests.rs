use super::*;
use crate::window::plan::declare::StepName as _;
use crate::window::plan::directory_plan;

const NS: &str = "ns1";

fn c(name: &str, paused: bool) -> ClusterSeen {
    ClusterSeen {
        key: format!("{NS}/{name}"),
        paused,
        ..ClusterSeen::default()
    }
}

fn planner(backup: bool, start: Start, recorded: bool) -> DirectoryPlanner {
    DirectoryPlanner {
        direction: match backup {
            true => Direction::Backup {
                namespaces: vec![NS.into()],
            },
            false => Direction::Restore { namespaces: vec![] },
        },
        start,
        recorded,
        clusters: match backup {
            true => vec![format!("{NS}/a")],
            false => vec![],
        },
    }
}

fn run() -> Start {
    Start {
        unpause: vec![],
        close: false,
        then: Then::Run {
            stopped_already: false,
        },
    }
}

fn exited(code: i32) -> Found {
    Found::Exited {
        status: ExitStatus {
            code: Some(code),
            signal: None,
        },
        what: format!("source: clusterctl move exited with exit code {code}"),
    }
}

/// The steps the runner takes: clusterctl ends with `code`, `failing` fails, and after
/// clusterctl the Clusters are as `after` and the window open; only what `reads` asks for is
/// read. The names, and how the run ended.
fn walk(
    p: &DirectoryPlanner,
    code: i32,
    failing: Option<DirectoryStep>,
    after: &[ClusterSeen],
) -> (Vec<&'static str>, Ended, bool) {
    let mut r = DirReached::default();
    let mut steps = Vec::new();
    while steps.len() < 30 {
        let read = match p.reads(&r) {
            true => DirRead {
                clusters: Seen::Read(after.to_vec()),
                open: Seen::Read(true),
            },
            false => DirRead::default(),
        };
        let step = p.next(&read, &r);
        steps.push(step.name().as_str());
        let o = match &step {
            _ if failing == Some(step.name()) => Observation::Failed(&"it failed"),
            DirStep::RunClusterctl { .. } => Observation::Done(exited(code)),
            _ => Observation::Done(Found::Nothing),
        };
        if p.observe(&mut r, &step, o) == Verdict::End {
            let last_failed = failing.is_some_and(|f| steps.last() == Some(&f.as_str()));
            return (steps, r.ended, last_failed);
        }
    }
    panic!("no end after {steps:?}");
}

#[test]
fn a_backup_pauses_stops_runs_clusterctl_and_puts_everything_back_even_when_it_failed() {
    let b = planner(true, run(), false);
    let (steps, ended, _) = walk(&b, 0, None, &[c("a", false)]);
    assert_eq!(
        steps,
        [
            "Check",
            "Record",
            "Pause",
            "WaitUnblocked",
            "Stop",
            "Unpause",
            "RunClusterctl",
            "PutBack",
            "Uninstall",
            "Done"
        ]
    );
    assert_eq!(ended, Ended::Done);
    // clusterctl failed: put back, recorded, removed, and its code is the run's.
    let (steps, ended, _) = walk(&b, 3, None, &[c("a", true)]);
    assert_eq!(
        steps[6..],
        ["RunClusterctl", "PutBack", "Fail", "Uninstall"]
    );
    assert_eq!(
        ended,
        Ended::Failed(Failure {
            what: "source: clusterctl move exited with exit code 3".into(),
            exit: Some(3)
        })
    );
    // A step from the pause on failed: the same way out, its error the run's.
    for failing in [
        DirectoryStep::Pause,
        DirectoryStep::WaitUnblocked,
        DirectoryStep::Stop,
        DirectoryStep::Unpause,
    ] {
        let (steps, ended, _) = walk(&b, 0, Some(failing), &[c("a", true)]);
        let at = steps.iter().position(|s| *s == failing.as_str()).unwrap();
        assert_eq!(
            steps[at + 1..],
            ["PutBack", "Fail", "Uninstall"],
            "{failing:?}"
        );
        assert_eq!(
            ended,
            Ended::Failed(Failure {
                what: "it failed".into(),
                exit: None
            })
        );
    }
    // Before anything was written that a put-back undoes, or while putting back: the error
    // ends the run at once.
    for failing in [
        DirectoryStep::Check,
        DirectoryStep::Record,
        DirectoryStep::PutBack,
    ] {
        let (steps, ended, last_failed) = walk(&b, 0, Some(failing), &[c("a", false)]);
        assert!(last_failed, "{failing:?}: {steps:?}");
        assert_eq!(ended, Ended::No);
    }
}

#[test]
fn what_the_backup_puts_back_is_what_it_paused_and_finds_paused_and_an_open_window() {
    let b = planner(true, run(), false);
    let r = DirReached {
        at: DirAt::Ran,
        ..DirReached::default()
    };
    assert!(b.reads(&r));
    let read = DirRead {
        clusters: Seen::Read(vec![c("a", true), c("theirs", true)]),
        open: Seen::Read(true),
    };
    assert_eq!(
        b.next(&read, &r),
        DirStep::PutBack {
            unpause: vec![format!("{NS}/a")],
            close: Some(MovePhase::Restoring),
            done: true
        }
    );
    // Nothing else is read on the way.
    for at in [
        DirAt::Begun,
        DirAt::Checked,
        DirAt::Unpaused,
        DirAt::PutBack,
    ] {
        assert!(
            !b.reads(&DirReached {
                at,
                ..DirReached::default()
            }),
            "{at:?}"
        );
    }
    assert!(!planner(false, run(), false).reads(&r));
}

#[test]
fn a_rerun_puts_back_what_an_earlier_one_left_and_an_abort_or_a_refusal_stops_there() {
    let window = "move-ns1";
    let rec = crate::resources::move_window::MoveRecord {
        clusters: vec![format!("{NS}/a")],
        ..Default::default()
    };
    let now = [c("a", true)];
    let direction = Direction::Backup {
        namespaces: vec![NS.into()],
    };
    let again = directory_plan::start(&direction, false, window, true, Some(&rec), &now);
    let (steps, ended, _) = walk(&planner(true, again, true), 0, None, &[c("a", false)]);
    assert_eq!(steps[..2], ["PutBack", "Check"]);
    assert_eq!(ended, Ended::Done);
    let abort = directory_plan::start(&direction, true, window, true, Some(&rec), &now);
    let (steps, ended, _) = walk(&planner(true, abort, true), 0, None, &[]);
    assert_eq!(steps, ["PutBack", "Aborted", "Uninstall"]);
    assert_eq!(ended, Ended::Aborted);
    let theirs = directory_plan::start(&direction, false, window, false, None, &[c("b", true)]);
    let (steps, ended, _) = walk(&planner(true, theirs, false), 0, None, &[]);
    assert_eq!(steps, ["Refuse", "Uninstall"]);
    assert!(matches!(ended, Ended::Refused(why) if why.to_string().contains("ns1/b")));
}

#[test]
fn a_restore_keeps_its_controllers_stopped_where_clusterctl_failed_and_a_rerun_runs_it_again() {
    let r = planner(false, run(), false);
    let (steps, ended, _) = walk(&r, 0, None, &[]);
    assert_eq!(
        steps,
        [
            "Check",
            "Record",
            "Stop",
            "RunClusterctl",
            "Restore",
            "Uninstall",
            "Done"
        ]
    );
    assert_eq!(ended, Ended::Done);
    let (steps, ended, _) = walk(&r, 2, None, &[]);
    assert_eq!(steps, ["Check", "Record", "Stop", "RunClusterctl", "Fail"]);
    assert!(matches!(
        ended,
        Ended::Failed(Failure { exit: Some(2), .. })
    ));
    // A restore's own steps before clusterctl end the run as they fail (nothing to put back).
    let (steps, ended, last_failed) = walk(&r, 0, Some(DirectoryStep::Stop), &[]);
    assert!(last_failed && ended == Ended::No, "{steps:?}");
    let again = directory_plan::start(
        &Direction::Restore { namespaces: vec![] },
        false,
        "w",
        true,
        None,
        &[],
    );
    let (steps, _, _) = walk(&planner(false, again, true), 0, None, &[]);
    assert_eq!(steps, ["RunClusterctl", "Restore", "Uninstall", "Done"]);
    let abort = directory_plan::start(
        &Direction::Restore { namespaces: vec![] },
        true,
        "w",
        true,
        None,
        &[],
    );
    let (steps, ended, _) = walk(&planner(false, abort, true), 0, None, &[]);
    assert_eq!(steps, ["PutBack", "Aborted", "Uninstall"]);
    assert_eq!(ended, Ended::Aborted);
}

#[test]
fn copying_is_recorded_by_a_backups_stop_and_by_a_restores_clusterctl() {
    let copying_at = |backup: bool, start: Start| {
        let p = planner(backup, start, false);
        let mut r = DirReached::default();
        let mut said = Vec::new();
        while said.len() < 12 {
            let step = p.next(&DirRead::default(), &r);
            match &step {
                DirStep::Stop { copying } => said.push(("Stop", *copying)),
                DirStep::RunClusterctl { copying } => {
                    said.push(("RunClusterctl", *copying));
                    return said;
                }
                _ => {}
            }
            assert_eq!(
                p.observe(&mut r, &step, Observation::Done(Found::Nothing)),
                Verdict::GoOn
            );
        }
        panic!("no clusterctl in {said:?}");
    };
    assert_eq!(
        copying_at(true, run()),
        [("Stop", true), ("RunClusterctl", false)]
    );
    assert_eq!(
        copying_at(false, run()),
        [("Stop", false), ("RunClusterctl", true)]
    );
    // A restore's re-run after its controllers were stopped: clusterctl again, recorded again.
    let again = Start {
        then: Then::Run {
            stopped_already: true,
        },
        ..run()
    };
    assert_eq!(copying_at(false, again), [("RunClusterctl", true)]);
}
