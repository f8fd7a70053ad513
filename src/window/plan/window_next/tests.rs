//! One row per phase and observation: where `window open` and `close` start, what they
//! resume, and what they refuse.

use super::*;

const W: &str = "move-ns1";

/// Every step an opening takes from `seen` to its end.
fn open(prove: bool, seen: &[Seen]) -> Vec<OpenStep> {
    let mut steps: Vec<OpenStep> = Vec::new();
    loop {
        let step = next_open(prove, W, seen, &steps);
        let end = matches!(step, OpenStep::Done | OpenStep::Refuse { .. });
        steps.push(step);
        assert!(steps.len() < 50, "no end: {steps:?}");
        if end {
            return steps;
        }
    }
}

/// Every step a close takes from `seen` to its end; `empty`: the clusters where
/// `ReleaseOrphans` finds nothing.
fn close(seen: &[Seen], empty: &[usize]) -> Vec<CloseStep> {
    let mut run = CloseRun::default();
    loop {
        let step = next_close(W, seen, &run);
        let end = matches!(step, CloseStep::Done | CloseStep::Refuse { .. });
        if let CloseStep::ReleaseOrphans(i) = step
            && empty.contains(&i)
        {
            run.nothing_here.push(i);
        }
        run.performed.push(step);
        assert!(run.performed.len() < 50, "no end: {:?}", run.performed);
        if end {
            return run.performed;
        }
    }
}

fn at(p: WindowPhase) -> Seen {
    Seen::At(Some(p))
}

#[test]
fn an_opening_records_every_window_before_it_stops_anything_and_proves_all_at_once() {
    assert_eq!(
        open(true, &[Seen::Absent, Seen::Absent]),
        vec![
            OpenStep::Check,
            OpenStep::Record {
                cluster: 0,
                fresh: true
            },
            OpenStep::Record {
                cluster: 1,
                fresh: true
            },
            OpenStep::Stop(0),
            OpenStep::Stop(1),
            OpenStep::Prove,
            OpenStep::Done,
        ]
    );
}

#[test]
fn a_take_stops_without_the_proof() {
    assert_eq!(
        open(false, &[Seen::Absent]),
        vec![
            OpenStep::Check,
            OpenStep::Record {
                cluster: 0,
                fresh: true
            },
            OpenStep::Stop(0),
            OpenStep::Done,
        ]
    );
}

#[test]
fn an_opening_resumes_what_an_opening_or_open_window_recorded_and_starts_anew_otherwise() {
    for (seen, fresh) in [
        (Seen::Absent, true),
        (Seen::At(None), true),
        (at(WindowPhase::Opening), false),
        (at(WindowPhase::Open), false),
        (at(WindowPhase::Closing), true),
        (at(WindowPhase::Closed), true),
    ] {
        let steps = open(true, std::slice::from_ref(&seen));
        assert_eq!(steps[1], OpenStep::Record { cluster: 0, fresh }, "{seen:?}");
        assert_eq!(steps.last(), Some(&OpenStep::Done), "{seen:?}");
    }
}

#[test]
fn a_phase_this_version_does_not_know_is_refused_before_anything_is_written() {
    let seen = [Seen::Absent, at(WindowPhase::Unknown("Draining".into()))];
    let check = |cluster: usize, message: &str| {
        assert_eq!(cluster, 1);
        assert!(message.contains("\"Draining\""), "{message}");
        assert!(message.contains(W), "{message}");
    };
    for prove in [false, true] {
        match open(prove, &seen).as_slice() {
            [OpenStep::Refuse { cluster, why }] => check(*cluster, &why.to_string()),
            steps => panic!("{steps:?}"),
        }
    }
    match close(&seen, &[]).as_slice() {
        [
            CloseStep::Refuse {
                cluster: Some(cluster),
                why,
            },
        ] => check(*cluster, &why.to_string()),
        steps => panic!("{steps:?}"),
    }
}

#[test]
fn a_close_restores_each_cluster_whole_in_the_order_given_scaled_before_leases() {
    assert_eq!(
        close(&[at(WindowPhase::Open), at(WindowPhase::Closing)], &[]),
        vec![
            CloseStep::MarkClosed {
                cluster: 0,
                closed_before: false
            },
            CloseStep::RestoreScaled(0),
            CloseStep::ReleaseLeases(0),
            CloseStep::RecordClosed(0),
            CloseStep::MarkClosed {
                cluster: 1,
                closed_before: false
            },
            CloseStep::RestoreScaled(1),
            CloseStep::ReleaseLeases(1),
            CloseStep::RecordClosed(1),
            CloseStep::Done,
        ]
    );
}

#[test]
fn a_close_of_every_phase_goes_through_every_step_and_a_closed_one_stays_closed() {
    for seen in [
        Seen::At(None),
        at(WindowPhase::Opening),
        at(WindowPhase::Open),
        at(WindowPhase::Closing),
        at(WindowPhase::Closed),
    ] {
        let closed_before = seen == at(WindowPhase::Closed);
        assert_eq!(
            close(std::slice::from_ref(&seen), &[]),
            vec![
                CloseStep::MarkClosed {
                    cluster: 0,
                    closed_before
                },
                CloseStep::RestoreScaled(0),
                CloseStep::ReleaseLeases(0),
                CloseStep::RecordClosed(0),
                CloseStep::Done,
            ],
            "{seen:?}"
        );
    }
}

#[test]
fn a_window_deleted_unclosed_has_its_leases_released_and_one_that_is_nowhere_is_refused() {
    // Absent on the target (an open that died before creating it there), open on the source.
    let steps = close(&[Seen::Absent, at(WindowPhase::Open)], &[0]);
    assert_eq!(steps[0], CloseStep::ReleaseOrphans(0));
    assert_eq!(steps.last(), Some(&CloseStep::Done));
    // Deleted with Leases still labelled: released, and that is a close.
    assert_eq!(
        close(&[Seen::Absent], &[]),
        vec![CloseStep::ReleaseOrphans(0), CloseStep::Done]
    );
    // Nowhere, holding nothing.
    assert_eq!(
        close(&[Seen::Absent, Seen::Absent], &[0, 1]).last(),
        Some(&CloseStep::Refuse {
            cluster: None,
            why: WindowRefusal::Nowhere(W.into()),
        })
    );
}

#[test]
fn every_window_phase_is_walked_by_open_and_by_close() {
    for p in WindowPhase::ALL {
        for prove in [false, true] {
            let steps = open(prove, &[at(p.clone())]);
            assert_eq!(steps.last(), Some(&OpenStep::Done), "open of {p:?}");
        }
        assert_eq!(
            close(&[at(p.clone())], &[]).last(),
            Some(&CloseStep::Done),
            "close of {p:?}"
        );
    }
}
