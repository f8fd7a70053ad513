//! A whole move walked against a toy source: each step's effect applied to it, the planner
//! given only what `reads` asked for (`Seen::NotRead` panics where it looks at more).

use super::*;
use crate::window::plan::all_namespaces::tests::{class, cluster};
use crate::window::plan::all_namespaces::{namespaces, order};
use crate::window::plan::declare::StepName as _;
use crate::window::plan::planner::ExitStatus;

#[derive(Clone)]
struct World {
    clusters: Vec<ClusterSeen>,
    classes: Vec<ClusterSeen>,
    /// The target's Clusters and ClusterClasses.
    target: Vec<ClusterSeen>,
    target_classes: Vec<ClusterSeen>,
    /// clusterctl's exit code for a namespace's run, where it fails.
    fails_on: Option<&'static str>,
    deleting: bool,
    version: &'static str,
}

/// Issue 52's shape: a class namespace, two teams on its class, a KCP Cluster of its own.
fn management_cluster() -> World {
    World {
        clusters: vec![
            cluster("kcp/wl3", None),
            cluster("team-a/wl1", Some("classes/quick-start")),
            cluster("team-b/wl2", Some("classes/quick-start")),
        ],
        classes: vec![class("classes/quick-start")],
        target: Vec::new(),
        target_classes: Vec::new(),
        fails_on: None,
        deleting: false,
        version: "v1.13.0",
    }
}

impl World {
    fn seen(&self, reads: WholeReads) -> WholeSeen {
        let read = |on: bool, v: Vec<ClusterSeen>| match on {
            true => Seen::Read(v),
            false => Seen::NotRead,
        };
        WholeSeen {
            order: match reads.order {
                true => Seen::Read(order(
                    &namespaces(&self.clusters, &self.classes, &[]),
                    &self.clusters,
                )),
                false => Seen::NotRead,
            },
            clusters: read(reads.clusters, self.clusters.clone()),
            classes: read(reads.clusters, self.classes.clone()),
            deleting: match reads.deleting {
                true => Seen::Read(self.deleting),
                false => Seen::NotRead,
            },
            version: match reads.version {
                true => Seen::Read(self.version.to_string()),
                false => Seen::NotRead,
            },
            target_clusters: read(reads.target, self.target.clone()),
            target_classes: read(reads.target, self.target_classes.clone()),
        }
    }

    fn set_paused(&mut self, keys: &[String], paused: bool) {
        for c in self.clusters.iter_mut().chain(self.classes.iter_mut()) {
            if keys.contains(&c.key) {
                c.paused = paused;
            }
        }
    }

    fn set_paused_in_target(&mut self, keys: &[String], paused: bool) {
        for c in self.target.iter_mut().chain(self.target_classes.iter_mut()) {
            if keys.contains(&c.key) {
                c.paused = paused;
            }
        }
    }

    /// clusterctl's move of `ns`: its Clusters go; the ClusterClasses they use elsewhere stay
    /// in the source, paused; its own go unless a Cluster still in the source uses them.
    fn clusterctl(&mut self, ns: &str) {
        let of = |k: &str| move_plan::namespace_of(k).to_string();
        let used: Vec<String> = self
            .clusters
            .iter()
            .filter(|c| of(&c.key) == ns)
            .filter_map(|c| c.class.clone())
            .collect();
        let (going, staying): (Vec<ClusterSeen>, Vec<ClusterSeen>) =
            self.clusters.drain(..).partition(|c| of(&c.key) == ns);
        self.clusters = staying;
        self.target.extend(
            going
                .into_iter()
                .map(|c| ClusterSeen { paused: false, ..c }),
        );
        for c in self
            .classes
            .iter()
            .filter(|c| of(&c.key) == ns || used.contains(&c.key))
        {
            if !self.target_classes.iter().any(|t| t.key == c.key) {
                self.target_classes.push(ClusterSeen {
                    paused: false,
                    ..c.clone()
                });
            }
        }
        let still_used: Vec<String> = self
            .clusters
            .iter()
            .filter_map(|c| c.class.clone())
            .collect();
        self.classes
            .retain(|c| of(&c.key) != ns || still_used.contains(&c.key));
        for c in self.classes.iter_mut() {
            if used.contains(&c.key) || (of(&c.key) == ns) {
                c.paused = true;
            }
        }
    }
}

struct Walk {
    steps: Vec<WholeStep>,
    reached: WholeReached,
    world: World,
}

/// Run the planner to its end against `world`; `fail` makes the named step fail once.
fn walk(
    abort: bool,
    record: Option<WholeRecord>,
    mut world: World,
    fail: Option<WholeStepName>,
) -> Walk {
    let p = WholePlanner {
        asked: WholeAsked {
            window: "move-all".into(),
            abort,
        },
        record,
    };
    let mut reached = WholeReached::default();
    let mut steps = Vec::new();
    for _ in 0..100 {
        let seen = world.seen(p.reads(&reached));
        let step = p.next(&seen, &reached);
        steps.push(step.clone());
        if fail == Some(step.name()) {
            let e = "the API server said no";
            if p.observe(&mut reached, &step, Observation::Failed(&e)) == Verdict::End {
                break;
            }
            continue;
        }
        let mut found = Found::Nothing;
        match &step {
            WholeStep::Pause(p) => {
                world.set_paused(&p.clusters, true);
                world.set_paused(&p.classes, true);
            }
            WholeStep::Unpause(p) | WholeStep::PutBack(p) => {
                world.set_paused(&p.clusters, false);
                world.set_paused(&p.classes, false);
            }
            WholeStep::Moved {
                unpause_classes,
                unpause_target,
                ..
            } => {
                world.set_paused(unpause_classes, false);
                world.set_paused_in_target(&unpause_target.clusters, false);
                world.set_paused_in_target(&unpause_target.classes, false);
            }
            WholeStep::Clusterctl { namespace } => {
                let code = match world.fails_on == Some(namespace.as_str()) {
                    true => 1,
                    false => {
                        world.clusterctl(namespace);
                        0
                    }
                };
                found = Found::Exited {
                    status: ExitStatus {
                        code: Some(code),
                        signal: None,
                    },
                    what: format!("clusterctl exited {code}"),
                };
            }
            _ => {}
        }
        if p.observe(&mut reached, &step, Observation::Done(found)) == Verdict::End {
            break;
        }
    }
    Walk {
        steps,
        reached,
        world,
    }
}

fn names(w: &Walk) -> Vec<String> {
    w.steps
        .iter()
        .map(|s| match s {
            WholeStep::Clusterctl { namespace } => format!("Clusterctl {namespace}"),
            WholeStep::Moved {
                namespace,
                unpause_classes,
                unpause_target,
            } => {
                let mut s = format!("Moved {namespace}");
                if !unpause_classes.is_empty() {
                    s += &format!(", unpausing {}", unpause_classes.join(","));
                }
                if !unpause_target.clusters.is_empty() {
                    s += &format!(
                        ", unpausing in the target {}",
                        unpause_target.clusters.join(",")
                    );
                }
                s
            }
            s => s.name().as_str().to_string(),
        })
        .collect()
}

fn states(r: &WholeReached) -> Vec<(String, NamespaceState)> {
    r.record.as_ref().expect("recorded").namespaces.clone()
}

#[test]
fn a_whole_move_stops_both_clusters_once_and_moves_every_namespace_class_users_first() {
    let w = walk(false, None, management_cluster(), None);
    assert_eq!(
        names(&w),
        [
            "Check",
            "Record",
            "Pause",
            "WaitUnblocked",
            "Stop",
            "Unpause",
            "Clusterctl kcp",
            "Moved kcp",
            "Clusterctl team-a",
            "Moved team-a, unpausing classes/quick-start",
            "Clusterctl team-b",
            "Moved team-b, unpausing classes/quick-start",
            "Clusterctl classes",
            "Moved classes",
            "Copied",
            "RestoreTarget",
            "RestoreSource",
            "Finish",
            "Uninstall",
            "Done",
        ]
    );
    assert_eq!(w.reached.ended, Ended::Done);
    assert!(w.world.clusters.is_empty() && w.world.classes.is_empty());
    let r = w.reached.record.unwrap();
    assert_eq!(r.phase, MovePhase::Done);
    assert!(
        r.namespaces
            .iter()
            .all(|(_, s)| *s == NamespaceState::Moved)
    );
    assert_eq!(
        r.paused.clusters,
        ["kcp/wl3", "team-a/wl1", "team-b/wl2"],
        "every Cluster recorded before it is paused"
    );
}

#[test]
fn nothing_paused_by_others_a_circle_or_an_old_clusterctl_starts_a_whole_move() {
    let mut paused = management_cluster();
    paused.clusters[1].paused = true;
    let w = walk(false, None, paused, None);
    assert_eq!(names(&w), ["Refuse", "Uninstall", "Done"]);
    let Ended::Refused(why) = &w.reached.ended else {
        panic!("{:?}", w.reached.ended)
    };
    assert!(why.to_string().contains("team-a/wl1"), "{why}");
    assert!(w.reached.record.is_none(), "nothing recorded");

    let mut circle = management_cluster();
    circle
        .clusters
        .push(cluster("classes/mgmt", Some("team-a/own")));
    circle.classes.push(class("team-a/own"));
    let w = walk(false, None, circle, None);
    assert!(matches!(
        w.reached.ended,
        Ended::Refused(WholeRefusal::Order(AllRefusal::ClassesInACircle { .. }))
    ));

    let mut old = management_cluster();
    old.version = "v1.5.0";
    let w = walk(false, None, old, None);
    assert!(
        matches!(w.reached.ended, Ended::Refused(WholeRefusal::Clusterctl(_))),
        "{:?}",
        w.reached.ended
    );
}

/// The record a run killed on `in_flight` left, with `moved` done before it.
fn left(phase: MovePhase, moved: &[&str], in_flight: Option<&str>) -> WholeRecord {
    let order = ["kcp", "team-a", "team-b", "classes"];
    WholeRecord {
        phase,
        namespaces: order
            .iter()
            .map(|n| {
                let s = match (moved.contains(n), in_flight == Some(*n)) {
                    (true, _) => NamespaceState::Moved,
                    (_, true) => NamespaceState::Copying,
                    _ => NamespaceState::Pending,
                };
                (n.to_string(), s)
            })
            .collect(),
        paused: Paused {
            clusters: vec!["kcp/wl3".into(), "team-a/wl1".into(), "team-b/wl2".into()],
            classes: vec!["classes/quick-start".into()],
        },
    }
}

#[test]
fn a_run_killed_in_the_second_namespace_is_finished_from_it_by_the_same_command() {
    let mut world = management_cluster();
    world.clusterctl("kcp");
    // Killed while clusterctl moved team-a: paused, partly copied.
    world.set_paused(&["team-a/wl1".into(), "team-b/wl2".into()], true);
    let w = walk(
        false,
        Some(left(MovePhase::Copying, &["kcp"], Some("team-a"))),
        world,
        None,
    );
    assert_eq!(
        names(&w)[..4],
        [
            "Stop",
            "Unpause",
            "Clusterctl team-a",
            "Moved team-a, unpausing classes/quick-start"
        ]
    );
    let WholeStep::Unpause(p) = &w.steps[1] else {
        unreachable!()
    };
    assert_eq!(
        p.clusters,
        ["team-a/wl1", "team-b/wl2"],
        "only what is paused"
    );
    assert_eq!(w.reached.ended, Ended::Done);
    assert!(w.world.clusters.is_empty());
}

#[test]
fn a_run_killed_before_the_stop_pauses_again_and_goes_on() {
    let mut world = management_cluster();
    world.set_paused(&["kcp/wl3".into()], true);
    let w = walk(false, Some(left(MovePhase::Moving, &[], None)), world, None);
    assert_eq!(names(&w)[..3], ["Pause", "WaitUnblocked", "Stop"]);
    assert_eq!(w.reached.ended, Ended::Done);
}

#[test]
fn a_failed_clusterctl_keeps_both_clusters_stopped_and_the_same_command_goes_on_from_it() {
    let mut world = management_cluster();
    world.fails_on = Some("team-b");
    let w = walk(false, None, world.clone(), None);
    assert_eq!(
        names(&w)[names(&w).len() - 3..],
        [
            "Moved team-a, unpausing classes/quick-start",
            "Clusterctl team-b",
            "Fail"
        ]
    );
    let Ended::Failed(f) = &w.reached.ended else {
        panic!("{:?}", w.reached.ended)
    };
    assert_eq!((f.namespace.as_str(), f.exit), ("team-b", Some(1)));
    let record = w.reached.record.clone().unwrap();
    assert_eq!(record.phase, MovePhase::Failed);
    assert_eq!(record.in_flight(), Some("team-b"));

    let mut world = w.world;
    world.fails_on = None;
    let again = walk(false, Some(record), world, None);
    assert_eq!(names(&again)[..3], ["Stop", "Unpause", "Clusterctl team-b"]);
    assert_eq!(again.reached.ended, Ended::Done);
    assert!(again.world.clusters.is_empty() && again.world.classes.is_empty());
}

#[test]
fn an_abort_puts_back_the_namespace_in_flight_and_leaves_the_moved_in_the_target() {
    let mut world = management_cluster();
    world.clusterctl("kcp");
    world.set_paused(&["team-a/wl1".into(), "team-b/wl2".into()], true);
    let record = left(MovePhase::Copying, &["kcp"], Some("team-a"));
    let w = walk(true, Some(record.clone()), world.clone(), None);
    assert_eq!(
        names(&w),
        [
            "BeginAbort",
            "RestoreTarget",
            "RestoreSource",
            "PutBack",
            "Aborted",
            "Uninstall",
            "Done"
        ]
    );
    assert_eq!(w.steps[2], WholeStep::RestoreSource { wait_leading: true });
    assert_eq!(
        w.steps[4],
        WholeStep::Aborted {
            moved: vec!["kcp".into()],
            in_flight: Some("team-a".into()),
            recorded: true,
        }
    );
    assert!(w.world.clusters.iter().all(|c| !c.paused));
    assert_eq!(w.reached.record.unwrap().phase, MovePhase::Aborted);

    // Once clusterctl began deleting team-a, only the same command can finish it.
    world.deleting = true;
    let w = walk(true, Some(record), world, None);
    assert_eq!(
        w.reached.ended,
        Ended::Refused(WholeRefusal::AbortPast("team-a".into()))
    );
    assert_eq!(names(&w), ["Refuse", "Uninstall", "Done"]);

    let w = walk(
        true,
        Some(left(
            MovePhase::Restoring,
            &["kcp", "team-a", "team-b", "classes"],
            None,
        )),
        management_cluster(),
        None,
    );
    assert_eq!(w.reached.ended, Ended::Refused(WholeRefusal::AbortCopied));
}

#[test]
fn a_failure_before_the_stop_puts_the_source_back_and_records_the_move_undone() {
    let w = walk(
        false,
        None,
        management_cluster(),
        Some(WholeStepName::WaitUnblocked),
    );
    assert_eq!(
        names(&w)[3..],
        [
            "WaitUnblocked",
            "BeginAbort",
            "RestoreTarget",
            "RestoreSource",
            "PutBack",
            "Aborted",
            "Uninstall",
            "Done"
        ]
    );
    assert_eq!(
        w.reached.failed_before_stop.as_deref(),
        Some("the API server said no")
    );
    assert!(w.world.clusters.iter().all(|c| !c.paused));
    assert!(w.world.classes.iter().all(|c| !c.paused));
    assert_eq!(w.reached.record.unwrap().phase, MovePhase::Aborted);
}

#[test]
fn a_failure_from_the_stop_on_ends_the_run_for_the_same_command_to_pick_up() {
    let w = walk(
        false,
        None,
        management_cluster(),
        Some(WholeStepName::Unpause),
    );
    assert_eq!(names(&w).last().unwrap(), "Unpause");
    assert_eq!(w.reached.ended, Ended::No);
    assert_eq!(w.reached.record.unwrap().phase, MovePhase::Copying);
}

#[test]
fn an_abort_with_nothing_recorded_only_tidies() {
    let w = walk(true, None, management_cluster(), None);
    assert_eq!(names(&w), ["Aborted", "Uninstall", "Done"]);
}

#[test]
fn states_are_recorded_as_clusterctl_goes() {
    let mut world = management_cluster();
    world.fails_on = Some("team-a");
    let w = walk(false, None, world, None);
    assert_eq!(
        states(&w.reached),
        [
            ("kcp".into(), NamespaceState::Moved),
            ("team-a".into(), NamespaceState::Copying),
            ("team-b".into(), NamespaceState::Pending),
            ("classes".into(), NamespaceState::Pending),
        ]
    );
}

#[test]
fn a_run_killed_before_clusterctl_unpaused_the_target_unpauses_it_there() {
    // clusterctl deleted team-a from the source and was killed before its last step.
    let mut world = management_cluster();
    world.clusterctl("kcp");
    world.clusterctl("team-a");
    world.set_paused_in_target(&["team-a/wl1".into()], true);
    world.set_paused(&["team-b/wl2".into()], true);
    let w = walk(
        false,
        Some(left(MovePhase::Copying, &["kcp"], Some("team-a"))),
        world,
        None,
    );
    assert_eq!(
        names(&w)[..4],
        [
            "Stop",
            "Unpause",
            "Clusterctl team-a",
            // The class it paused was unpaused before clusterctl ran again, which found
            // nothing of team-a left to pause.
            "Moved team-a, unpausing in the target team-a/wl1"
        ]
    );
    assert!(
        w.world.target.iter().all(|c| !c.paused),
        "{:?}",
        w.world.target
    );
    assert_eq!(w.reached.ended, Ended::Done);
}

#[test]
fn an_abort_with_every_namespace_moved_or_one_unfinished_is_refused_and_says_why() {
    let w = walk(
        true,
        Some(left(
            MovePhase::Copying,
            &["kcp", "team-a", "team-b", "classes"],
            None,
        )),
        World {
            clusters: vec![],
            classes: vec![],
            ..management_cluster()
        },
        None,
    );
    assert_eq!(w.reached.ended, Ended::Refused(WholeRefusal::AbortCopied));

    let w = walk(
        false,
        Some(left(MovePhase::Aborting, &["kcp"], None)),
        management_cluster(),
        None,
    );
    assert_eq!(
        w.reached.ended,
        Ended::Refused(WholeRefusal::AbortUnfinished)
    );

    // An --abort of a move recorded done changes no record.
    let w = walk(
        true,
        Some(left(
            MovePhase::Done,
            &["kcp", "team-a", "team-b", "classes"],
            None,
        )),
        management_cluster(),
        None,
    );
    assert_eq!(
        w.steps[0],
        WholeStep::Aborted {
            moved: vec![],
            in_flight: None,
            recorded: false
        }
    );
}

#[test]
fn what_changed_between_the_checks_and_the_record_is_judged_again() {
    // The checks pass; a Cluster is paused by someone else before the record is written.
    let p = WholePlanner {
        asked: WholeAsked::default(),
        record: None,
    };
    let mut world = management_cluster();
    let mut reached = WholeReached::default();
    let step = p.next(&world.seen(p.reads(&reached)), &reached);
    assert!(matches!(step, WholeStep::Check { .. }), "{step:?}");
    p.observe(&mut reached, &step, Observation::Done(Found::Nothing));
    world.set_paused(&["kcp/wl3".into()], true);
    let step = p.next(&world.seen(p.reads(&reached)), &reached);
    assert!(
        matches!(step, WholeStep::Refuse(WholeRefusal::Paused(_))),
        "{step:?}"
    );
    // Or everything is gone: refused, not a panic.
    world.clusters.clear();
    world.classes.clear();
    let step = p.next(&world.seen(p.reads(&reached)), &reached);
    assert_eq!(
        step,
        WholeStep::Refuse(WholeRefusal::Order(AllRefusal::Nothing))
    );
}
