use super::*;
use crate::resources::phase::MovePhase;
use crate::window::plan::declare::StepName as _;
use crate::window::plan::planner::{Catch, ExitStatus, Interrupt, Observation, Planner, Verdict};
use MoveRole::{Source, Target};

const NS: &str = "clusters";

/// The checks of a clusterctl whose version says it waits for block-move.
const CHECK: Step = Step::Check { warn: None };

/// The lift once clusterctl's part is over.
const LIFT: Step = Step::Lift(Lifting::WayOut);

/// The lift that lets clusterctl copy, both clusters proven stopped.
const LET_COPY: Step = Step::Lift(Lifting::Copy);

fn asked(abort: bool) -> Asked {
    Asked {
        window: "move-clusters".into(),
        namespace: NS.into(),
        abort,
    }
}

fn c(name: &str, paused: bool) -> ClusterSeen {
    ClusterSeen {
        key: format!("{NS}/{name}"),
        paused,
        ..ClusterSeen::default()
    }
}

fn record(phase: MovePhase, exit: Option<i32>) -> MoveRecord {
    MoveRecord {
        phase,
        namespace: NS.into(),
        clusters: vec![format!("{NS}/a")],
        clusterctl_exit: exit,
        ..MoveRecord::default()
    }
}

/// What both clusters hold, as a test sets it up; the planner sees of it only what `reads`
/// asks for (`observed`).
#[derive(Debug, Clone)]
struct World {
    source: Vec<ClusterSeen>,
    target: Vec<ClusterSeen>,
    class_users: Vec<ClusterSeen>,
    classes: Vec<ClusterSeen>,
    deleting: bool,
    /// What `clusterctl version -o short` says.
    version: String,
    /// Whether the source's window is open.
    source_open: bool,
}

/// Nothing in either cluster, and a clusterctl that waits for block-move.
impl Default for World {
    fn default() -> World {
        World {
            source: Vec::new(),
            target: Vec::new(),
            class_users: Vec::new(),
            classes: Vec::new(),
            deleting: false,
            version: "v1.13.0".into(),
            source_open: false,
        }
    }
}

/// What the driver would read of `world` for `reads`: nothing else.
fn observed(world: &World, reads: &Reads) -> Observed {
    let read = |yes: bool, v: &Vec<ClusterSeen>| match yes {
        true => Seen::Read(v.clone()),
        false => Seen::NotRead,
    };
    Observed {
        source: read(reads.clusters, &world.source),
        target: read(reads.clusters, &world.target),
        class_users: read(reads.clusters, &world.class_users),
        classes: read(reads.classes, &world.classes),
        deleting: match reads.deletes {
            true => Seen::Read(world.deleting),
            false => Seen::NotRead,
        },
        version: match reads.version {
            true => Seen::Read(world.version.clone()),
            false => Seen::NotRead,
        },
        source_open: match reads.source_window {
            true => Seen::Read(world.source_open),
            false => Seen::NotRead,
        },
    }
}

fn began(start: Start) -> Step {
    Step::Begin(Begun::new(NS, start, false))
}

fn began_abort(start: Start) -> Step {
    Step::Begin(Begun::new(NS, start, true))
}

/// Both clusters before a move: one running Cluster in the source, nothing in the target.
fn before() -> World {
    World {
        source: vec![c("a", false)],
        ..World::default()
    }
}

/// What a step changes of what the next read sees (what clusterctl paused, unpaused).
fn world(step: &Step, seen: &mut World) {
    match step {
        Step::PutSourceBack { unpause, .. } | Step::KeepSourceStopped { unpause } => seen
            .source
            .iter_mut()
            .filter(|c| unpause.clusters.contains(&c.key))
            .for_each(|c| c.paused = false),
        Step::UnpauseTarget(keys) => seen
            .target
            .iter_mut()
            .filter(|c| keys.contains(&c.key))
            .for_each(|c| c.paused = false),
        _ => {}
    }
}

fn status(code: i32) -> ExitStatus {
    ExitStatus {
        code: Some(code),
        signal: None,
    }
}

/// The steps the runner would take with this planner, each performed as it succeeds,
/// clusterctl pausing the source's Clusters and exiting with `exit`, and `failing` failing as
/// it is performed; the planner sees only what it asked to read.
fn walk(
    asked: &Asked,
    record: Option<&MoveRecord>,
    seen: &World,
    exit: i32,
    failing: Option<StepName>,
) -> Vec<Step> {
    let planner = MovePlanner {
        asked: asked.clone(),
    };
    let mut seen = seen.clone();
    let mut reached = Reached::default();
    let mut steps = Vec::new();
    while steps.len() < 40 {
        let reads = reads(asked, record, &reached);
        let read = Read {
            record: match reads_record(&reached) {
                true => Seen::Read(record.cloned()),
                false => Seen::NotRead,
            },
            seen: observed(&seen, &reads),
            reads,
        };
        let step = planner.next(&read, &reached);
        steps.push(step.clone());
        if matches!(step, Step::Refuse { .. } | Step::Fail(_) | Step::Done) {
            return steps;
        }
        let failed = format!("{:?} failed", step.name());
        let o = match &step {
            _ if failing == Some(step.name()) => Observation::Failed(&failed),
            Step::AwaitPause => Observation::Done(Found::SourcePaused(
                seen.source.iter().map(|c| c.key.clone()).collect(),
            )),
            // Only its end ends it: the runner cuts the wait.
            Step::AwaitClusterctl => Observation::Cut(Interrupt::Exited(status(exit))),
            _ => Observation::Done(Found::Nothing),
        };
        assert_eq!(
            planner.observe(&mut reached, &step, o),
            Verdict::GoOn,
            "{step:?}"
        );
        world(&step, &mut seen);
    }
    panic!("no end after {steps:?}");
}

fn moved(asked: &Asked, record: Option<&MoveRecord>, seen: &World) -> Vec<Step> {
    walk(asked, record, seen, 0, None)
}

fn restore_then_finish() -> Vec<Step> {
    vec![
        Step::Copied,
        Step::RestoreTarget,
        Step::RestoreSource {
            wait_leading: false,
        },
        Step::Finish,
        Step::Uninstall,
        Step::Done,
    ]
}

/// The target taken for a move that begins as `start`, the block-move on `clusters/a`.
fn stop_target(start: Start) -> Step {
    Step::StopTarget {
        block_move: BlockMoveOn::clusters(vec![format!("{NS}/a")]),
        standbys_first: true,
        keep_stop_times: start != Start::Fresh,
    }
}

fn hold() -> Step {
    Step::Hold {
        block_move: BlockMoveOn::clusters(vec![format!("{NS}/a")]),
    }
}

/// clusterctl's run while the source runs: started, the source stopped once it paused
/// `clusters/a`, both proven, the block-move lifted, its end awaited.
fn clusterctl_ran(exit: i32) -> Vec<Step> {
    vec![
        Step::StartClusterctl { watch_pause: true },
        Step::AwaitPause,
        Step::StopSource {
            paused: vec![format!("{NS}/a")],
        },
        Step::ProveStopped,
        LET_COPY,
        Step::AwaitClusterctl,
        Step::ClusterctlExited {
            status: status(exit),
            unheld: false,
        },
    ]
}

fn refused(steps: &[Step]) -> (MoveRole, String) {
    match steps.last() {
        Some(Step::Refuse { cluster, why }) => (*cluster, why.to_string()),
        s => panic!("not refused: {s:?} in {steps:?}"),
    }
}

#[test]
fn a_new_move_stops_the_target_holds_clusterctl_and_restores_the_target_first() {
    let mut want = vec![
        began(Start::Fresh),
        CHECK,
        stop_target(Start::Fresh),
        hold(),
    ];
    want.extend(clusterctl_ran(0));
    want.push(LIFT);
    want.extend(restore_then_finish());
    assert_eq!(moved(&asked(false), None, &before()), want);
    // A record of a move that ended is no move.
    for over in [MovePhase::Done, MovePhase::Aborted, MovePhase::Unrecorded] {
        let r = record(over, Some(0));
        assert_eq!(moved(&asked(false), Some(&r), &before()), want);
    }
}

#[test]
fn every_way_out_after_the_block_move_lifts_it_then_records_the_failure() {
    let steps = walk(&asked(false), None, &before(), 1, None);
    let mut want = clusterctl_ran(1);
    want.extend([
        LIFT,
        Step::Fail(Outcome::Exited {
            exit: 1,
            what: "clusterctl move exited with exit code 1".into(),
        }),
    ]);
    assert_eq!(steps[steps.len() - want.len()..], want);
    // handoff's own failure while it puts the block-move on, or starts clusterctl: clusterctl
    // never runs.
    for failing in [StepName::Hold, StepName::StartClusterctl] {
        let steps = walk(&asked(false), None, &before(), 0, Some(failing));
        assert_eq!(
            steps[steps.len() - 2..],
            [
                LIFT,
                Step::Fail(Outcome::Stopped(format!(
                    "handoff move stopped: {failing:?} failed"
                )))
            ]
        );
        assert_eq!(steps[steps.len() - 3].name(), failing);
    }
    // The source could not be stopped, or not proven stopped: clusterctl is stopped before
    // it copies anything (the block-move is never lifted for it), and that is the outcome,
    // whatever it exits with.
    for (failing, at) in [(StepName::StopSource, 2), (StepName::ProveStopped, 3)] {
        let steps = walk(&asked(false), None, &before(), 143, Some(failing));
        let from = steps.iter().position(|s| *s == Step::AwaitPause).unwrap();
        assert_eq!(steps[from + at - 1].name(), failing, "{steps:?}");
        assert_eq!(
            steps[from + at..],
            [
                Step::SignalClusterctl {
                    signal: libc::SIGTERM,
                    because: Because::Stopped(format!("{failing:?} failed")),
                },
                Step::AwaitClusterctl,
                Step::ClusterctlExited {
                    status: status(143),
                    unheld: false,
                },
                LIFT,
                Step::Fail(Outcome::Stopped(format!(
                    "handoff move stopped: {failing:?} failed"
                ))),
            ]
        );
        assert!(!steps.contains(&LET_COPY), "{steps:?}");
        assert!(!steps.contains(&Step::Copied), "{steps:?}");
    }
}

#[test]
fn a_move_refuses_before_it_writes_anything_what_clusterctl_or_its_hold_could_not_take() {
    let check = |seen: World| {
        let steps = moved(&asked(false), None, &seen);
        assert_eq!(steps[..2], [began(Start::Fresh), CHECK]);
        assert_eq!(steps.len(), 3, "{steps:?}");
        let (cluster, message) = refused(&steps);
        assert_eq!(cluster, Source);
        message.to_string()
    };
    let paused = check(World {
        source: vec![c("a", false), c("b", true)],
        ..before()
    });
    assert!(
        paused.contains("clusters/b") && paused.contains("-n clusters patch"),
        "{paused}"
    );
    let class = check(World {
        classes: vec![c("class", true)],
        ..before()
    });
    assert!(class.contains("clusters/class"), "{class}");
    let empty = World {
        source: vec![],
        ..before()
    };
    assert!(check(empty).contains("no Cluster"));
    let mut theirs = before();
    theirs.source[0].block_move = Some("".into());
    assert!(check(theirs).contains("not handoff's"));
}

#[test]
fn a_clusterctl_older_than_its_block_move_wait_is_refused_and_one_unread_is_warned_of() {
    let old = World {
        version: "v1.5.3".into(),
        ..before()
    };
    let steps = moved(&asked(false), None, &old);
    assert_eq!(steps.len(), 2, "nothing after the refusal: {steps:?}");
    let (cluster, message) = refused(&steps);
    assert_eq!(cluster, Source);
    assert!(
        message.contains("clusterctl v1.5.3 is older than v1.6"),
        "{message}"
    );
    let odd = World {
        version: "devel".into(),
        ..before()
    };
    let steps = moved(&asked(false), None, &odd);
    assert!(
        matches!(&steps[1], Step::Check { warn: Some(w) } if w.to_string().contains("\"devel\"")),
        "{steps:?}"
    );
    assert_eq!(steps.last(), Some(&Step::Done), "{steps:?}");
    // An --abort runs no clusterctl: its version is never read, wherever it is.
    for at_ in [
        AbortAt::Begun,
        AbortAt::Recorded,
        AbortAt::Lifted,
        AbortAt::SourceBack,
    ] {
        let b = Reached::Begun(Begun {
            path: Path::Abort(at_),
            ..Begun::new(NS, Start::Resume, true)
        });
        assert!(!reads(&asked(true), None, &b).version, "{at_:?}");
    }
    let abort = walk(&asked(true), None, &old, 0, None);
    assert!(
        !abort.iter().any(|s| matches!(s, Step::Refuse { .. })),
        "{abort:?}"
    );
}

#[test]
fn a_rerun_puts_the_source_back_unless_clusterctl_began_deleting() {
    // Nothing deleted yet: the source runs again, clusterctl starts over.
    for phase in [
        MovePhase::StoppingTarget,
        MovePhase::Moving,
        MovePhase::StoppingSource,
        MovePhase::Copying,
        MovePhase::Failed,
    ] {
        let r = record(phase.clone(), None);
        let steps = moved(&asked(false), Some(&r), &before());
        assert_eq!(
            steps[..4],
            [
                began(Start::Resume),
                CHECK,
                Step::PutSourceBack {
                    close_window: false,
                    unpause: Paused::default(),
                },
                stop_target(Start::Resume),
            ],
            "{phase}"
        );
        assert_eq!(steps[4], hold(), "{phase}");
    }
    // Deletes begun: the source stays stopped, no block-move (nothing of the source's runs to
    // wait for), and the target is proven before clusterctl starts.
    let r = record(MovePhase::Copying, None);
    let deleting = World {
        source: vec![c("a", true)],
        target: vec![c("a", true)],
        deleting: true,
        ..World::default()
    };
    let mut want = vec![
        began(Start::ResumeStopped),
        CHECK,
        Step::KeepSourceStopped {
            unpause: Paused {
                clusters: vec![format!("{NS}/a")],
                classes: vec![],
            },
        },
        Step::StopTarget {
            block_move: BlockMoveOn::default(),
            standbys_first: false,
            keep_stop_times: true,
        },
        Step::ProveTarget,
        Step::Hold {
            block_move: BlockMoveOn::default(),
        },
        // Stopped already: no pause to wait for, nothing to stop.
        Step::StartClusterctl { watch_pause: false },
        Step::AwaitClusterctl,
        Step::ClusterctlExited {
            status: status(0),
            unheld: false,
        },
        LIFT,
    ];
    want.extend(restore_then_finish());
    assert_eq!(moved(&asked(false), Some(&r), &deleting), want);
}

#[test]
fn after_clusterctl_moved_everything_a_rerun_only_finishes() {
    // clusterctl exited 0: the restore alone, recorded as such first.
    let r = record(MovePhase::Restoring, Some(0));
    let mut want = vec![began(Start::RestoreOnly)];
    want.extend(restore_then_finish());
    assert_eq!(moved(&asked(false), Some(&r), &before()), want);
    // Everything in the target and gone from the source, the target still paused (clusterctl
    // died before its last step): only the move's own Clusters are unpaused there.
    let r = record(MovePhase::Copying, None);
    let seen = World {
        target: vec![c("a", true), c("users-own", true)],
        ..World::default()
    };
    let mut want = vec![
        began(Start::FinishTarget),
        Step::UnpauseTarget(vec![format!("{NS}/a")]),
    ];
    want.extend(restore_then_finish());
    assert_eq!(moved(&asked(false), Some(&r), &seen), want);
}

#[test]
fn a_run_refuses_a_record_it_must_not_act_on() {
    let other = record(MovePhase::Failed, Some(1));
    let elsewhere = Asked {
        namespace: "elsewhere".into(),
        ..asked(false)
    };
    let steps = moved(&elsewhere, Some(&other), &before());
    let (cluster, message) = refused(&steps);
    assert_eq!(cluster, Target);
    assert!(message.contains("--namespace clusters"), "{message}");
    let aborting = record(MovePhase::Aborting, None);
    let steps = moved(&asked(false), Some(&aborting), &before());
    let (_, message) = refused(&steps);
    assert!(message.contains("run it again with --abort"), "{message}");
    // A phase another version wrote: refused by name, whichever way.
    let later = record(MovePhase::from("Verifying".to_string()), None);
    for abort in [false, true] {
        let steps = moved(&asked(abort), Some(&later), &before());
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert!(refused(&steps).1.contains("\"Verifying\""), "{steps:?}");
    }
}

#[test]
fn an_abort_restores_the_source_first_and_only_before_clusterctl_deleted() {
    let abort_steps = |begun: Start, recorded: bool| {
        let mut v = vec![began_abort(begun)];
        if recorded {
            v.push(Step::BeginAbort);
        }
        v.extend([
            Step::Lift(Lifting::Abort),
            Step::RestoreSource { wait_leading: true },
            Step::RestoreTarget,
            Step::Aborted { recorded },
            Step::Uninstall,
            Step::Done,
        ]);
        v
    };
    // Nothing recorded: whatever the window stopped comes back, nothing is recorded.
    assert_eq!(
        moved(&asked(true), None, &before()),
        abort_steps(Start::Fresh, false)
    );
    let r = record(MovePhase::Moving, None);
    assert_eq!(
        moved(&asked(true), Some(&r), &before()),
        abort_steps(Start::Resume, true)
    );
    // An --abort that died is finished by the next.
    let r = record(MovePhase::Aborting, None);
    assert_eq!(
        moved(&asked(true), Some(&r), &before()),
        abort_steps(Start::Resume, true)
    );
    // It acts on the recorded namespace, whatever --namespace says.
    let elsewhere = Asked {
        namespace: "elsewhere".into(),
        ..asked(true)
    };
    assert_eq!(namespace(&elsewhere, Some(&r)), NS);
    assert_eq!(namespace(&elsewhere, None), "elsewhere");
    assert_eq!(namespace(&asked(false), Some(&r)), NS);
    // Once clusterctl began deleting, or moved everything: refused, nothing written.
    let deleting = World {
        deleting: true,
        ..before()
    };
    for (r, seen) in [
        (record(MovePhase::Copying, None), &deleting),
        (record(MovePhase::Restoring, Some(0)), &before()),
        (
            record(MovePhase::Copying, None),
            &World {
                target: vec![c("a", true)],
                ..World::default()
            },
        ),
    ] {
        let steps = moved(&asked(true), Some(&r), seen);
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert!(
            refused(&steps)
                .1
                .contains("run the same command without --abort"),
            "{steps:?}"
        );
    }
}

fn read(clusters: bool, classes: bool, deletes: bool) -> Reads {
    Reads {
        namespace: NS.into(),
        clusters,
        classes,
        deletes,
        version: false,
        source_window: false,
    }
}

fn at(start: Start, path: Path) -> Reached {
    Reached::Begun(Begun {
        namespace: NS.into(),
        start,
        path,
    })
}

#[test]
fn the_clusters_are_read_only_where_a_step_may_need_them() {
    let fresh = Reached::New;
    let r = record(MovePhase::Copying, None);
    // Picking up a recorded move: the Clusters and whether clusterctl deletes.
    assert_eq!(
        reads(&asked(false), Some(&r), &fresh),
        read(true, true, true)
    );
    assert_eq!(
        reads(&asked(true), Some(&r), &fresh),
        read(true, true, true)
    );
    // A new move: nothing before it begins, the Clusters until the target is taken.
    assert_eq!(
        reads(&asked(false), None, &fresh),
        read(false, false, false)
    );
    for before_taken in [MoveAt::Begun, MoveAt::Checked, MoveAt::SourcePrepared] {
        // clusterctl's version only for the checks.
        let version = before_taken == MoveAt::Begun;
        assert_eq!(
            reads(
                &asked(false),
                None,
                &at(Start::Fresh, Path::Move(before_taken))
            ),
            Reads {
                version,
                ..read(true, true, false)
            }
        );
    }
    let taken = MoveAt::TargetTaken(BlockMoveOn::default());
    for after in [
        Path::Move(taken),
        Path::Move(MoveAt::Held),
        Path::Ended(Outcome::Moved),
    ] {
        assert_eq!(
            reads(&asked(false), None, &at(Start::Fresh, after)),
            read(false, false, false)
        );
    }
    // A finished copy's unpause reads the target's Clusters; the restore reads the
    // ClusterClasses for the source's unpause, then nothing.
    let finishing = |s: Start, f: FinishAt| reads(&asked(false), Some(&r), &at(s, Path::Finish(f)));
    assert_eq!(
        finishing(Start::FinishTarget, FinishAt::Begun),
        read(true, true, false)
    );
    // Where nothing is to be unpaused in the target, nothing is read for it.
    for s in [Start::RestoreOnly, Start::Fresh] {
        assert_eq!(finishing(s, FinishAt::Begun), read(false, false, false));
    }
    assert_eq!(
        finishing(Start::FinishTarget, FinishAt::Copied),
        read(false, true, false)
    );
    for f in [
        FinishAt::SourceUnpaused,
        FinishAt::TargetBack,
        FinishAt::Finished,
    ] {
        assert_eq!(finishing(Start::Fresh, f), read(false, false, false));
    }
    // An --abort reads the ClusterClasses once it lifted (for its unpause), and the Clusters
    // for its report only (the driver's, after its steps). It acts on the recorded
    // namespace, read before it begins.
    let aborting = |a: AbortAt| reads(&asked(true), None, &at(Start::Fresh, Path::Abort(a)));
    assert_eq!(aborting(AbortAt::Begun), read(false, false, false));
    assert_eq!(aborting(AbortAt::Lifted), read(false, true, false));
    assert_eq!(aborting(AbortAt::SourceBack), read(false, false, false));
    let elsewhere = Asked {
        namespace: "elsewhere".into(),
        ..asked(true)
    };
    assert_eq!(reads(&elsewhere, Some(&r), &fresh).namespace, NS);
}

#[test]
fn a_step_the_planner_never_gives_from_where_the_run_is_stops_it() {
    for (reached, step) in [
        (Reached::New, CHECK),
        (at(Start::Fresh, Path::Move(MoveAt::Begun)), hold()),
        (
            at(Start::Fresh, Path::Finish(FinishAt::TargetBack)),
            Step::RestoreTarget,
        ),
        (
            at(Start::Fresh, Path::Abort(AbortAt::SourceBack)),
            Step::RestoreSource { wait_leading: true },
        ),
        (at(Start::Fresh, Path::Abort(AbortAt::Begun)), Step::Copied),
    ] {
        let was = reached.clone();
        let panicked = std::panic::catch_unwind(move || {
            let mut r = reached;
            r.performed(&step, Found::Nothing);
        });
        assert!(panicked.is_err(), "{was:?}");
    }
}

#[test]
#[should_panic(expected = "used the source's Clusters, which `reads` did not ask for")]
fn a_planner_that_looks_at_what_it_did_not_read_is_caught() {
    let taking = at(Start::Fresh, Path::Move(MoveAt::Checked));
    next(&asked(false), None, &Observed::default(), &taking);
}

/// A ClusterClass `ns/name`, as the source holds it.
fn class(key: &str, paused: bool) -> ClusterSeen {
    ClusterSeen {
        key: key.into(),
        paused,
        ..ClusterSeen::default()
    }
}

/// A Cluster of this namespace that uses `class`.
fn using(name: &str, class: &str) -> ClusterSeen {
    ClusterSeen {
        class: Some(class.into()),
        ..c(name, false)
    }
}

#[test]
fn a_shared_cluster_class_paused_before_the_move_refuses_it_by_name() {
    let seen = World {
        source: vec![using("a", "classes/quick")],
        classes: vec![class("classes/quick", true)],
        ..World::default()
    };
    let steps = moved(&asked(false), None, &seen);
    let (cluster, why) = refused(&steps);
    assert_eq!(cluster, Source);
    assert!(
        why.contains("ClusterClass classes/quick: kubectl -n classes annotate"),
        "{why}"
    );
    // Unpaused, the move goes on; the block-move goes on the Clusters, never on the class.
    let seen = World {
        classes: vec![class("classes/quick", false)],
        ..seen
    };
    assert_eq!(
        moved(&asked(false), None, &seen)[2],
        stop_target(Start::Fresh)
    );
}

#[test]
fn what_clusterctl_paused_and_left_in_the_source_is_unpaused_before_the_restore() {
    let r = MoveRecord {
        cluster_classes: vec!["classes/quick".into(), format!("{NS}/own")],
        ..record(MovePhase::Restoring, Some(0))
    };
    // After clusterctl: the shared class paused and left in the source, the namespace's own
    // class deleted from it.
    let after = World {
        classes: vec![class("classes/quick", true)],
        ..World::default()
    };
    // Asked with what `reads` asks for there, as the driver would.
    let ask = |asked: &Asked, world: &World, reached: &Reached| {
        let what = reads(asked, Some(&r), reached);
        next(asked, Some(&r), &observed(world, &what), reached)
    };
    let copied = at(Start::RestoreOnly, Path::Finish(FinishAt::Copied));
    assert_eq!(
        ask(&asked(false), &after, &copied),
        Step::UnpauseSource(vec!["classes/quick".into()])
    );
    let unpaused = at(Start::RestoreOnly, Path::Finish(FinishAt::SourceUnpaused));
    assert_eq!(ask(&asked(false), &after, &unpaused), Step::RestoreTarget);
    // Nothing left paused there: straight to the restore.
    assert_eq!(
        ask(&asked(false), &World::default(), &copied),
        Step::RestoreTarget
    );
    // An --abort unpauses the other namespaces' classes only: the namespace's own stay
    // paused with its Clusters, for the user to decide (copies may be in the target).
    let both = World {
        classes: vec![
            class("classes/quick", true),
            class(&format!("{NS}/own"), true),
        ],
        ..World::default()
    };
    let lifted = at(Start::Resume, Path::Abort(AbortAt::Lifted));
    assert_eq!(
        ask(&asked(true), &both, &lifted),
        Step::UnpauseSource(vec!["classes/quick".into()])
    );
}

#[test]
fn a_namespace_of_cluster_classes_alone_is_held_by_its_classes_or_refused_while_used() {
    let classes_only = World {
        classes: vec![class(&format!("{NS}/quick"), false)],
        ..World::default()
    };
    let steps = moved(&asked(false), None, &classes_only);
    assert_eq!(
        steps[2],
        Step::StopTarget {
            block_move: BlockMoveOn {
                holds: move_plan::Holds::ClusterClasses,
                keys: vec![format!("{NS}/quick")],
            },
            standbys_first: true,
            keep_stop_times: false,
        }
    );
    assert_eq!(steps.last(), Some(&Step::Done), "{steps:?}");
    let used = World {
        class_users: vec![ClusterSeen {
            key: "team-b/b1".into(),
            class: Some(format!("{NS}/quick")),
            ..ClusterSeen::default()
        }],
        ..classes_only
    };
    let steps = moved(&asked(false), None, &used);
    let (cluster, why) = refused(&steps);
    assert_eq!(cluster, Source);
    assert!(
        why.contains("Cluster team-b/b1 uses ClusterClass clusters/quick"),
        "{why}"
    );
}

/// The phases of the book's "If a move stops" table, a row each (`none` for no record).
fn books_phases() -> Vec<String> {
    let page = include_str!("../../../../docs/src/tasks/move.md");
    let table = page
        .split("<!-- crash-points: checked by tests/capi/crash.rs -->")
        .nth(1)
        .expect("the crash-points table");
    table
        .lines()
        .skip(3)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').nth(1).unwrap_or_default().trim().to_string())
        .map(|cell| match cell.starts_with("`none`") {
            true => "none".into(),
            false => cell.trim_matches('`').to_string(),
        })
        .collect()
}

/// The table's rows: (phase, exit, what the clusters hold, the re-run's start, whether
/// `--abort` acts).
type Row = (Option<MovePhase>, Option<i32>, World, Start, bool);

fn table_rows() -> Vec<Row> {
    let nothing_copied = before();
    let paused_source = World {
        source: vec![c("a", true)],
        ..World::default()
    };
    let partly_copied = World {
        target: vec![c("a", true)],
        ..paused_source.clone()
    };
    let deleting = World {
        deleting: true,
        ..partly_copied.clone()
    };
    let all_in_target = World {
        target: vec![c("a", true)],
        ..World::default()
    };
    vec![
        (None, None, nothing_copied.clone(), Start::Fresh, true),
        (
            Some(MovePhase::StoppingTarget),
            None,
            nothing_copied.clone(),
            Start::Resume,
            true,
        ),
        (
            Some(MovePhase::Moving),
            None,
            paused_source.clone(),
            Start::Resume,
            true,
        ),
        (
            Some(MovePhase::StoppingSource),
            None,
            paused_source.clone(),
            Start::Resume,
            true,
        ),
        (
            Some(MovePhase::Copying),
            None,
            partly_copied.clone(),
            Start::Resume,
            true,
        ),
        (
            Some(MovePhase::Copying),
            None,
            deleting.clone(),
            Start::ResumeStopped,
            false,
        ),
        (
            Some(MovePhase::Copying),
            None,
            all_in_target.clone(),
            Start::FinishTarget,
            false,
        ),
        (
            Some(MovePhase::Restoring),
            Some(0),
            all_in_target.clone(),
            Start::RestoreOnly,
            false,
        ),
        (
            Some(MovePhase::Done),
            Some(0),
            all_in_target.clone(),
            Start::Tidy,
            true,
        ),
        // clusterctl failed, or died alone (`-1`: by a signal), and handoff recorded it.
        (
            Some(MovePhase::Failed),
            Some(-1),
            partly_copied.clone(),
            Start::Resume,
            true,
        ),
        (
            Some(MovePhase::Failed),
            Some(-1),
            deleting.clone(),
            Start::ResumeStopped,
            false,
        ),
    ]
}

/// The book's "If a move stops": for each phase a killed move can leave, and what the
/// clusters hold then, what the same command does and what `--abort` does.
#[test]
fn every_row_of_the_books_table_is_a_row_here() {
    let rows = table_rows();
    for (phase, exit, seen, start, abortable) in &rows {
        let r = phase.clone().map(|p| record(p, *exit));
        let steps = moved(&asked(false), r.as_ref(), seen);
        assert_eq!(steps[0], began(start.clone()), "{phase:?} {seen:?}");
        assert_eq!(steps.last(), Some(&Step::Done), "{phase:?}: {steps:?}");
        // Every re-run that gets that far restores the target's controllers first.
        let t = steps.iter().position(|s| *s == Step::RestoreTarget);
        let s = steps
            .iter()
            .position(|s| s.name() == StepName::RestoreSource);
        assert!(
            t < s || (t.is_none() && s.is_none()),
            "{phase:?}: {steps:?}"
        );
        let aborted = moved(&asked(true), r.as_ref(), seen);
        match abortable {
            true => assert_eq!(aborted.last(), Some(&Step::Done), "{phase:?}: {aborted:?}"),
            false => {
                refused(&aborted);
            }
        }
    }
    // An --abort stopped midway: the move is refused until the same --abort finishes it.
    let r = record(MovePhase::Aborting, None);
    let paused_source = World {
        source: vec![c("a", true)],
        ..World::default()
    };
    refused(&moved(&asked(false), Some(&r), &paused_source));
    let aborted = moved(&asked(true), Some(&r), &paused_source);
    assert_eq!(aborted.last(), Some(&Step::Done), "Aborting: {aborted:?}");
    // And the book has a row for each of these phases and no other.
    let mut in_book = books_phases();
    let mut here: Vec<String> = rows
        .iter()
        .map(|(p, ..)| p.as_ref().map_or("none".into(), |p| p.to_string()))
        .chain(["Aborting".to_string()])
        .collect();
    in_book.dedup();
    here.dedup();
    assert_eq!(in_book, here);
}

#[test]
fn a_move_recorded_done_and_done_indeed_only_removes_what_it_brought() {
    let r = record(MovePhase::Done, Some(0));
    let after = World {
        target: vec![c("a", false)],
        ..World::default()
    };
    assert_eq!(
        moved(&asked(false), Some(&r), &after),
        vec![began(Start::Tidy), Step::Uninstall, Step::Done]
    );
    // Its Clusters read: a run that died while removing them is finished by the next.
    assert_eq!(
        reads(&asked(false), Some(&r), &Reached::New),
        read(true, true, false)
    );
    // Still in the source (moved back since, or never gone): a new move.
    let both = World {
        source: vec![c("a", false)],
        target: vec![c("a", false)],
        ..World::default()
    };
    assert_eq!(
        moved(&asked(false), Some(&r), &both)[0],
        began(Start::Fresh)
    );
    // Another namespace's record, an aborted one, or a record of no Clusters: a new move.
    let other = Asked {
        namespace: "elsewhere".into(),
        ..asked(false)
    };
    assert_eq!(
        moved(&other, Some(&r), &after)[0],
        Step::Begin(Begun::new("elsewhere", Start::Fresh, false))
    );
    let aborted = record(MovePhase::Aborted, Some(0));
    assert_eq!(
        moved(&asked(false), Some(&aborted), &after)[0],
        began(Start::Fresh)
    );
    let empty = MoveRecord {
        clusters: vec![],
        ..r.clone()
    };
    assert_eq!(
        moved(&asked(false), Some(&empty), &after)[0],
        began(Start::Fresh)
    );
}

/// A fresh move driven as the runner would, each step answered by `answer` (`None`: done,
/// finding nothing), and `between` handed over after the step it names: the steps it took.
fn driven(
    answer: impl Fn(&Step) -> Option<Observation<'static, Found>>,
    between: impl Fn(&Step) -> Option<Interrupt>,
) -> Vec<Step> {
    let planner = MovePlanner {
        asked: asked(false),
    };
    let world = before();
    let mut reached = Reached::default();
    let mut steps = Vec::new();
    while steps.len() < 40 {
        let reads = reads(&planner.asked, None, &reached);
        let read = Read {
            record: match reads_record(&reached) {
                true => Seen::Read(None),
                false => Seen::NotRead,
            },
            seen: observed(&world, &reads),
            reads,
        };
        let step = planner.next(&read, &reached);
        steps.push(step.clone());
        if matches!(step, Step::Fail(_) | Step::Done | Step::Refuse { .. }) {
            return steps;
        }
        let o = answer(&step).unwrap_or(match step {
            Step::AwaitPause => Observation::Done(Found::SourcePaused(vec![format!("{NS}/a")])),
            _ => Observation::Done(Found::Nothing),
        });
        assert_eq!(planner.observe(&mut reached, &step, o), Verdict::GoOn);
        if let Some(i) = between(&step) {
            planner.interrupted(&mut reached, i);
        }
    }
    panic!("no end after {steps:?}");
}

fn after(steps: &[Step], name: StepName) -> &[Step] {
    let i = steps.iter().position(|s| s.name() == name).unwrap();
    &steps[i + 1..]
}

#[test]
fn a_signal_before_clusterctl_starts_stops_the_move_and_during_its_run_goes_to_clusterctl() {
    // Caught while the target is taken (held), delivered once the block-move is on: clusterctl
    // never starts.
    let steps = driven(
        |_| None,
        |s| matches!(s, Step::Hold { .. }).then_some(Interrupt::Signal(libc::SIGINT)),
    );
    assert_eq!(
        after(&steps, StepName::Hold),
        [
            LIFT,
            Step::Fail(Outcome::Stopped(
                "handoff move stopped: source: interrupted (signal 2) before clusterctl started"
                    .into()
            ))
        ]
    );
    // While clusterctl waits on the pause, or while the source is stopped or proven: passed
    // on at once (it copies nothing yet), and the way out after clusterctl's end.
    for cut in [
        StepName::AwaitPause,
        StepName::StopSource,
        StepName::ProveStopped,
    ] {
        let steps = driven(
            |s| match (s.name() == cut, s) {
                (true, _) => Some(Observation::Cut(Interrupt::Signal(libc::SIGINT))),
                (false, Step::AwaitClusterctl) => {
                    Some(Observation::Cut(Interrupt::Exited(status(130))))
                }
                _ => None,
            },
            |_| None,
        );
        assert_eq!(
            after(&steps, cut),
            [
                Step::SignalClusterctl {
                    signal: libc::SIGINT,
                    because: Because::Interrupted { copying: false },
                },
                Step::AwaitClusterctl,
                Step::ClusterctlExited {
                    status: status(130),
                    unheld: false,
                },
                LIFT,
                Step::Fail(Outcome::Exited {
                    exit: 130,
                    what: "clusterctl move exited with exit code 130 (handoff was interrupted and passed the signal on)".into(),
                }),
            ],
            "{cut:?}"
        );
    }
}

#[test]
fn clusterctl_ending_while_the_source_is_stopped_is_acted_on_at_once() {
    for cut in [StepName::StopSource, StepName::ProveStopped] {
        let steps = driven(
            |s| (s.name() == cut).then_some(Observation::Cut(Interrupt::Exited(status(1)))),
            |_| None,
        );
        assert_eq!(
            after(&steps, cut),
            [
                Step::ClusterctlExited {
                    status: status(1),
                    unheld: false,
                },
                LIFT,
                Step::Fail(Outcome::Exited {
                    exit: 1,
                    what: "clusterctl move exited with exit code 1".into(),
                }),
            ],
            "{cut:?}"
        );
    }
    // Exiting 0 before handoff let it copy: it did not wait for the block-move; said, and
    // the move goes on to the restore.
    let steps = driven(
        |s| matches!(s, Step::AwaitPause).then_some(Observation::Cut(Interrupt::Exited(status(0)))),
        |_| None,
    );
    assert_eq!(
        after(&steps, StepName::AwaitPause)[..3],
        [
            Step::ClusterctlExited {
                status: status(0),
                unheld: true,
            },
            LIFT,
            Step::Copied,
        ]
    );
}

#[test]
fn signals_are_held_from_the_checks_go_to_clusterctl_while_it_runs_then_end_handoff() {
    let planner = MovePlanner {
        asked: asked(false),
    };
    let catch = |path: Path| planner.catch(&at(Start::Fresh, path));
    assert_eq!(planner.catch(&Reached::New), Catch::Default);
    assert_eq!(catch(Path::Move(MoveAt::Begun)), Catch::Default);
    for held in [
        MoveAt::Checked,
        MoveAt::SourcePrepared,
        MoveAt::TargetTaken(BlockMoveOn::default()),
        MoveAt::TargetProven(BlockMoveOn::default()),
    ] {
        assert_eq!(catch(Path::Move(held)), Catch::Hold);
    }
    assert_eq!(catch(Path::Move(MoveAt::Held)), Catch::Deliver);
    let span = Span {
        at: SpanAt::Started,
        copying: false,
        stopped: None,
        interrupted: false,
    };
    assert_eq!(catch(Path::Clusterctl(span)), Catch::Deliver);
    for after in [
        Path::Ended(Outcome::Moved),
        Path::Failing(Outcome::Moved),
        Path::Finish(FinishAt::Begun),
        Path::Abort(AbortAt::Begun),
        Path::Tidy { uninstalled: false },
    ] {
        assert_eq!(catch(after), Catch::Default);
    }
    // Only the waits and the source's stop may be cut: every step of a move, its abort and
    // its failure, as the walks give them.
    let mut all = moved(&asked(false), None, &before());
    all.extend(walk(
        &asked(false),
        None,
        &before(),
        1,
        Some(StepName::StopSource),
    ));
    all.extend(moved(
        &asked(true),
        Some(&record(MovePhase::Moving, None)),
        &before(),
    ));
    let mut cut: Vec<StepName> = all
        .iter()
        .filter(|s| MovePlanner::cuttable(s))
        .map(Step::name)
        .collect();
    cut.sort_by_key(|n| n.as_str());
    cut.dedup();
    assert_eq!(
        cut,
        [
            StepName::AwaitClusterctl,
            StepName::AwaitPause,
            StepName::ProveStopped,
            StepName::StopSource
        ]
    );
}

#[test]
fn nothing_is_read_while_clusterctl_runs() {
    // A read that failed there would end the run, and clusterctl with it, under its copy.
    let span = Span {
        at: SpanAt::Copying,
        copying: true,
        stopped: None,
        interrupted: false,
    };
    let running = at(Start::Fresh, Path::Clusterctl(span));
    assert!(!reads_record(&running));
    assert_eq!(
        reads(&asked(false), None, &running),
        read(false, false, false)
    );
    for other in [
        Reached::New,
        at(Start::Fresh, Path::Move(MoveAt::Held)),
        at(Start::Fresh, Path::Ended(Outcome::Moved)),
    ] {
        assert!(reads_record(&other), "{other:?}");
    }
}

#[test]
fn a_resumed_move_closes_an_open_source_window_and_unpauses_only_what_clusterctl_paused() {
    let mut r = record(MovePhase::Copying, Some(1));
    r.paused_by_clusterctl = vec![format!("{NS}/b")];
    r.cluster_classes = vec![format!("{NS}/class")];
    let seen = World {
        // a: at the move's start, paused since (handoff died before it saw the pause); b: seen
        // paused by clusterctl; theirs: paused by somebody else, never handoff's to unpause.
        source: vec![c("a", true), c("b", true), c("theirs", true)],
        classes: vec![c("class", true)],
        source_open: true,
        ..World::default()
    };
    let steps = moved(&asked(false), Some(&r), &seen);
    assert_eq!(
        steps[2],
        Step::PutSourceBack {
            close_window: true,
            unpause: Paused {
                clusters: vec![format!("{NS}/a"), format!("{NS}/b")],
                classes: vec![format!("{NS}/class")],
            },
        },
        "{steps:?}"
    );
    // A window closed already is left alone.
    let closed = World {
        source_open: false,
        ..seen
    };
    let steps = moved(&asked(false), Some(&r), &closed);
    assert!(
        matches!(
            &steps[2],
            Step::PutSourceBack {
                close_window: false,
                ..
            }
        ),
        "{steps:?}"
    );
}

#[test]
fn a_resume_whose_record_went_meanwhile_is_refused_before_it_acts() {
    let b = Begun::new(NS, Start::Resume, false);
    let reached = Reached::Begun(Begun {
        path: Path::Move(MoveAt::Checked),
        ..b
    });
    let step = next(
        &asked(false),
        None,
        &observed(&before(), &read(true, true, false)),
        &reached,
    );
    assert!(
        matches!(&step, Step::Refuse { cluster: Target, why: Refusal::RecordGone(w) } if w == "move-clusters"),
        "{step:?}"
    );
}
