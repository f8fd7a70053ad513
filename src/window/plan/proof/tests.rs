//! One row per way a former leader's Pod can end, each with the source it relies on (see the
//! module's comment).

use super::*;
use serde_json::json;

const HOLDER: &str = "capi-controller-manager-6tbm48qnnq-x7k2p_0a1b2c3d";
const POD: &str = "capi-controller-manager-6tbm48qnnq-x7k2p";
const UID: &str = "5b0c1f7e-0000-4000-8000-000000000001";
const ID: &str = "containerd://aaa";

fn t0() -> Timestamp {
    "2026-12-05T10:00:00Z".parse().unwrap()
}

fn at(s: i64) -> Timestamp {
    t0() + k8s_openapi::jiff::SignedDuration::from_secs(s)
}

fn pod(ids: &[&str]) -> FormerPod {
    FormerPod {
        name: POD.into(),
        uid: UID.into(),
        container_ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

fn takeover<'a>(holder: &'a str, pod: Option<&'a FormerPod>) -> Takeover<'a> {
    Takeover {
        held_since: t0(),
        lease_seconds: 15,
        former_holder: holder,
        deployment: "capi-controller-manager",
        pod,
    }
}

fn ended(s: i64, ids: &[(&str, Option<&str>)]) -> PodReport {
    PodReport::Status {
        at: at(s),
        uid: UID.into(),
        ended: ids
            .iter()
            .map(|(id, r)| (id.to_string(), r.map(str::to_string)))
            .collect(),
        running: vec![],
    }
}

/// A report with instances running since `started` (seconds from the take-over).
fn with_running(r: PodReport, started: &[i64]) -> PodReport {
    match r {
        PodReport::Status {
            at: when,
            uid,
            ended,
            ..
        } => PodReport::Status {
            at: when,
            uid,
            ended,
            running: started.iter().map(|s| Some(at(*s))).collect(),
        },
        r => r,
    }
}

fn waits(p: &Proof) -> &str {
    match p {
        Proof::Wait { until, why } => {
            assert_eq!(*until, at(15), "the bound");
            why
        }
        p => panic!("{p:?}"),
    }
}

#[test]
fn a_lease_nobody_held_is_proven_at_the_take_over() {
    assert_eq!(
        proof(&takeover("", None), &[], t0()),
        Proof::Proven {
            at: t0(),
            by: ProvenBy::NobodyLed
        }
    );
}

#[test]
fn a_deleted_pods_last_status_proves_its_leader_exited() {
    // status_manager.go: every container `terminated` under its ID, written before the
    // final delete; a watch sees it, and the DELETED event carries it again.
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    let reports = [
        ended(1, &[]),
        ended(4, &[(ID, Some("Completed"))]),
        ended(4, &[(ID, Some("Completed"))]),
        PodReport::Gone { at: at(4) },
    ];
    let want = Proof::Proven {
        at: at(4),
        by: ProvenBy::Exited,
    };
    assert_eq!(proof(&t, &reports, at(5)), want);
    // Only the DELETED event's object seen (the watch joined late): the same proof.
    assert_eq!(proof(&t, &reports[2..], at(5)), want);
}

#[test]
fn an_in_place_restart_proves_the_instance_that_led_exited() {
    // kubelet_pods.go: the ended instance under `lastState.terminated.containerID`; a new one
    // starts only once it is not running (computePodActions).
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    assert_eq!(
        proof(&t, &[ended(12, &[(ID, Some("Error"))])], at(12)),
        Proof::Proven {
            at: at(12),
            by: ProvenBy::Exited
        }
    );
}

#[test]
fn an_end_beside_an_instance_running_since_before_the_take_over_proves_nothing() {
    // The read right after the take-over lagged: it showed the old instance running while a
    // newer one (which may have taken the Lease) already ran. The report that shows the old
    // one ended shows the newer one running since before the take-over.
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    waits(&proof(
        &t,
        &[with_running(ended(3, &[(ID, Some("Error"))]), &[-2])],
        at(3),
    ));
    // Started 4 s after it: within the clocks' margin, so nothing either.
    waits(&proof(
        &t,
        &[with_running(ended(6, &[(ID, Some("Error"))]), &[4])],
        at(6),
    ));
    // Restarted well after the take-over (the leader noticed, exited, and came back): proven.
    assert_eq!(
        proof(
            &t,
            &[with_running(ended(14, &[(ID, Some("Error"))]), &[12])],
            at(14)
        ),
        Proof::Proven {
            at: at(14),
            by: ProvenBy::Exited
        }
    );
}

#[test]
fn the_kubelets_invented_end_proves_nothing() {
    // ContainerStatusUnknown: the runtime lost the container; the kubelet did not see it end.
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    let r = [ended(3, &[(ID, Some(UNKNOWN_END))])];
    assert!(waits(&proof(&t, &r, at(3))).contains("has not reported"));
    assert_eq!(
        proof(&t, &r, at(15)),
        Proof::Proven {
            at: at(15),
            by: ProvenBy::Bound(format!("the kubelet has not reported Pod {POD} ended")),
        }
    );
}

#[test]
fn every_instance_running_at_the_take_over_must_have_ended() {
    let p = pod(&[ID, "containerd://sidecar"]);
    let t = takeover(HOLDER, Some(&p));
    waits(&proof(&t, &[ended(3, &[(ID, None)])], at(3)));
    assert_eq!(
        proof(
            &t,
            &[
                ended(3, &[(ID, None)]),
                ended(5, &[(ID, None), ("containerd://sidecar", None)])
            ],
            at(5)
        ),
        Proof::Proven {
            at: at(5),
            by: ProvenBy::Exited
        }
    );
    // An instance that ended is another one than the one recorded: nothing.
    waits(&proof(
        &t,
        &[ended(3, &[("containerd://older", None)])],
        at(3),
    ));
}

#[test]
fn a_pod_gone_with_no_report_of_its_end_waits_for_the_bound_and_says_why() {
    // A force delete, the API server's shortcut (strategy.go), or pod GC (gc_controller.go):
    // the object goes, the process may not have.
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    let r = [ended(1, &[]), PodReport::Gone { at: at(1) }];
    let why = waits(&proof(&t, &r, at(2))).to_string();
    assert!(why.contains("force delete"), "{why}");
    assert_eq!(
        proof(&t, &r, at(16)),
        Proof::Proven {
            at: at(15),
            by: ProvenBy::Bound(why)
        }
    );
}

#[test]
fn a_holder_that_is_no_pod_waits_for_the_bound() {
    // A manager run from a laptop: its identity is its hostname's, no Pod's.
    let t = takeover("laptop_0a1b", None);
    let why = waits(&proof(&t, &[], at(1))).to_string();
    assert!(
        why.contains("is no Pod of Deployment capi-controller-manager"),
        "{why}"
    );
    // Its Pod, gone before the take-over could read it (or with no running container).
    let t = takeover(HOLDER, None);
    let why = waits(&proof(&t, &[], at(1))).to_string();
    assert!(why.contains(&format!("its Pod {POD} was gone")), "{why}");
}

#[test]
fn a_node_that_stops_reporting_leaves_the_bound() {
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    let r = [ended(1, &[])];
    waits(&proof(&t, &r, at(14)));
    assert!(matches!(
        proof(&t, &r, at(15)),
        Proof::Proven {
            by: ProvenBy::Bound(_),
            ..
        }
    ));
}

#[test]
fn another_pod_of_the_same_name_proves_nothing() {
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    let other = PodReport::Status {
        at: at(2),
        uid: "another".into(),
        ended: vec![(ID.into(), None)],
        running: vec![],
    };
    waits(&proof(&t, &[other], at(2)));
}

#[test]
fn an_end_reported_after_the_bound_is_proven_by_the_bound() {
    let p = pod(&[ID]);
    let t = takeover(HOLDER, Some(&p));
    assert!(matches!(
        proof(&t, &[ended(20, &[(ID, None)])], at(20)),
        Proof::Proven { at: a, by: ProvenBy::Bound(_) } if a == at(15)
    ));
}

fn k8s_pod(statuses: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": POD, "namespace": "capi-system", "uid": UID},
        "status": {"containerStatuses": statuses},
    }))
    .unwrap()
}

#[test]
fn the_take_over_records_the_instances_the_kubelet_reports_running() {
    let running = k8s_pod(json!([
        {"name": "manager", "image": "m", "imageID": "", "ready": true, "restartCount": 1,
         "containerID": ID, "state": {"running": {"startedAt": "2026-12-05T09:00:00Z"}},
         "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://old"}}},
    ]));
    assert_eq!(former_pod(&running), Some(pod(&[ID])));
    // Waiting to restart: no instance runs that could be ended, so nothing to prove it by.
    let waiting = k8s_pod(json!([
        {"name": "manager", "image": "m", "imageID": "", "ready": false, "restartCount": 2,
         "containerID": "containerd://old", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
    ]));
    assert_eq!(former_pod(&waiting), None);
    // One container running, another not: the leader may be where the report lags.
    let half = k8s_pod(json!([
        {"name": "manager", "image": "m", "imageID": "", "ready": false, "restartCount": 1,
         "containerID": "containerd://old", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        {"name": "proxy", "image": "p", "imageID": "", "ready": true, "restartCount": 0,
         "containerID": "containerd://proxy", "state": {"running": {}}},
    ]));
    assert_eq!(former_pod(&half), None);
}

#[test]
fn a_report_lists_every_ended_instance_in_state_and_last_state() {
    let p = k8s_pod(json!([
        {"name": "manager", "image": "m", "imageID": "", "ready": false, "restartCount": 1,
         "containerID": ID,
         "state": {"terminated": {"exitCode": 0, "reason": "Completed", "containerID": ID}},
         "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "containerID": "containerd://old"}}},
        {"name": "lost", "image": "m", "imageID": "", "ready": false, "restartCount": 0,
         "state": {"terminated": {"exitCode": 137, "reason": UNKNOWN_END}}},
    ]));
    assert_eq!(
        report(&p, at(3)),
        PodReport::Status {
            at: at(3),
            uid: UID.into(),
            ended: vec![
                (ID.into(), Some("Completed".into())),
                ("containerd://old".into(), Some("Error".into())),
            ],
            running: vec![],
        }
    );
}

#[test]
fn a_dry_run_says_which_proof_each_leader_is_expected_to_get() {
    let dep = "capi-controller-manager";
    let nobody = expected("", dep, true, 10, 15);
    assert!(nobody.said.contains("nobody leads") && nobody.within == 0);
    let deleted = expected(HOLDER, dep, true, 10, 15);
    assert!(
        deleted
            .said
            .contains("kubelet reports its leader's Pod ended")
            && deleted.said.contains("10s"),
        "{deleted:?}"
    );
    assert_eq!(deleted.within, 10, "its grace period, not the bound");
    // A grace period longer than the Lease: the bound comes first.
    assert_eq!(expected(HOLDER, dep, true, 30, 15).within, 15);
    let restart = expected(HOLDER, dep, false, 10, 60);
    assert!(restart.said.contains("restarted") && restart.within == 60);
    let laptop = expected("laptop_0a1b", dep, true, 10, 60);
    assert!(
        laptop.said.starts_with("proven by its Lease bound, 60s") && laptop.within == 60,
        "{laptop:?}"
    );
}
