//! The crash suite's table of cases and which of them a run takes (`crash.rs` runs them).
//!
//! A case is a first kill, the way the move goes on (the same command, or `--abort` first),
//! and a chained kill: the re-run (or the `--abort`) killed in turn at the first write of its
//! `chain`-th step of its own (`RECOVERY`), then finished. Where the recovery has fewer steps
//! of its own than that, nothing is killed the second time, and the case is the plain one.
//!
//! The cases fall into groups: one per step of `handoff move` that writes (its crash points in
//! that step), one per point of clusterctl's (its pause, its creates, its first delete), and
//! clusterctl dying alone (handoff sees it fail, and records it: `Fail`). Every run takes a case
//! of every group, rotating the point and the way from run to run; `HANDOFF_CRASH_CASES=all`
//! takes the whole table, in shards (`HANDOFF_CRASH_SHARD=i/n`) that resume from a ledger of
//! the cases passed (`HANDOFF_CRASH_LEDGER`).

use std::collections::BTreeSet;

/// The steps only a re-run or an `--abort` performs, where a chained kill lands.
pub const RECOVERY: [&str; 8] = [
    "PutSourceBack",
    "KeepSourceStopped",
    "ProveTarget",
    "UnpauseTarget",
    "UnpauseSource",
    "Fail",
    "BeginAbort",
    "Aborted",
];

/// The group of clusterctl dying alone.
pub const CLUSTERCTL_ALONE: &str = "clusterctl dies alone";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Rerun,
    Abort,
}

/// The first kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// handoff, at the crash point of this index (`crash::points`).
    At(usize),
    /// clusterctl alone, at its first create: handoff lifts its block-move and records the
    /// move failed; with `in_fail`, handoff is killed too, at its `Fail` step's first write.
    ClusterctlAlone { in_fail: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub kill: Kill,
    pub then: Then,
    /// The recovery's own step (of `RECOVERY`, in the order it takes them, from 1) at whose
    /// first write the chained kill lands.
    pub chain: usize,
}

impl Case {
    pub fn describe(&self) -> String {
        let kill = match self.kill {
            Kill::At(p) => format!("killed at #{p}"),
            Kill::ClusterctlAlone { in_fail: false } => "clusterctl killed alone".to_string(),
            Kill::ClusterctlAlone { in_fail: true } => {
                "clusterctl killed alone, then handoff in Fail".to_string()
            }
        };
        let then = match self.then {
            Then::Rerun => "the same command",
            Then::Abort => "--abort",
        };
        format!("{kill}, then {then} killed at its own step #{}", self.chain)
    }
}

/// Every case, in an order that stays put while the points do (`HANDOFF_CRASH_ONLY` and the
/// ledger name cases by number): each point's, then clusterctl's dying alone.
pub fn table(points: usize) -> Vec<Case> {
    let kills = (0..points)
        .map(Kill::At)
        .chain([false, true].map(|in_fail| Kill::ClusterctlAlone { in_fail }));
    kills
        .flat_map(|kill| {
            [1, 2].into_iter().flat_map(move |chain| {
                [Then::Rerun, Then::Abort].map(|then| Case { kill, then, chain })
            })
        })
        .collect()
}

/// The groups, in the order the reference move meets them: (name, its cases' numbers).
/// `point_groups[p]` is point `p`'s group.
pub fn groups(table: &[Case], point_groups: &[String]) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (c, case) in table.iter().enumerate() {
        let g = match case.kill {
            Kill::At(p) => point_groups[p].clone(),
            Kill::ClusterctlAlone { .. } => CLUSTERCTL_ALONE.to_string(),
        };
        match out.iter_mut().find(|(name, _)| *name == g) {
            Some((_, cases)) => cases.push(c),
            None => out.push((g, vec![c])),
        }
    }
    out
}

/// How many cases `HANDOFF_CRASH_CASES` asks for: `all`, or a count per group of at least 1
/// (unset or empty: 1). Anything else is an error that names it: a run that quietly ran one
/// case, or none, would pass for the run that was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseCount {
    All,
    PerGroup(usize),
}

pub fn case_count(cases: Option<&str>) -> Result<CaseCount, String> {
    match cases.map(str::trim) {
        None | Some("") => Ok(CaseCount::PerGroup(1)),
        Some("all") => Ok(CaseCount::All),
        Some(v) => match v.parse::<usize>() {
            Ok(0) => Err("HANDOFF_CRASH_CASES=0 runs no case; unset it for one per group, or give a count per group of 1 or more, or all".into()),
            Ok(k) => Ok(CaseCount::PerGroup(k)),
            Err(_) => Err(format!(
                "HANDOFF_CRASH_CASES={v:?}: not a count of cases per group (1 or more) nor all"
            )),
        },
    }
}

/// The cases `HANDOFF_CRASH_ONLY` names, of `n`. A number the points of this run do not reach
/// names no case, and a list of none runs nothing: either would pass as if they had run.
pub fn only_cases(only: &str, n: usize) -> Result<Vec<usize>, String> {
    let chosen = only
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|i| {
            i.parse::<usize>().map_err(|_| {
                format!("HANDOFF_CRASH_ONLY={only}: {i:?} is not a case number (comma-separated numbers)")
            })
        })
        .collect::<Result<Vec<usize>, String>>()?;
    if chosen.is_empty() {
        return Err(format!(
            "HANDOFF_CRASH_ONLY={only:?} names no case; unset it, or name the cases (4,17)"
        ));
    }
    let out: Vec<usize> = chosen.iter().copied().filter(|i| *i >= n).collect();
    if !out.is_empty() {
        return Err(format!(
            "HANDOFF_CRASH_ONLY={only}: {out:?} out of range: this run has {n} cases, 0 to {}",
            n.saturating_sub(1)
        ));
    }
    Ok(chosen)
}

/// `HANDOFF_CRASH_SHARD=i/n`: the whole table's cases `c` with `c % n == i`.
pub fn shard(v: &str) -> Result<(usize, usize), String> {
    let parsed = v
        .trim()
        .split_once('/')
        .and_then(|(i, n)| Some((i.trim().parse().ok()?, n.trim().parse().ok()?)));
    match parsed {
        Some((i, n)) if n > 0 && i < n => Ok((i, n)),
        _ => Err(format!(
            "HANDOFF_CRASH_SHARD={v:?}: give i/n with 0 <= i < n (0/4, 1/4, 2/4, 3/4 split the table in four)"
        )),
    }
}

/// The cases a ledger (`HANDOFF_CRASH_LEDGER`, one line per case run) says passed, and the
/// phases their kills met.
pub fn passed(ledger: &str) -> (BTreeSet<usize>, BTreeSet<String>) {
    let mut cases = BTreeSet::new();
    let mut phases = BTreeSet::new();
    for l in ledger.lines() {
        let Some((c, rest)) = l
            .strip_prefix("case ")
            .and_then(|l| l.split_once(" passed"))
        else {
            continue;
        };
        let Ok(c) = c.parse() else { continue };
        cases.insert(c);
        if let Some(p) = rest
            .split_once("[phases: ")
            .and_then(|(_, p)| p.split_once(']'))
        {
            phases.extend(
                p.0.split(", ")
                    .filter(|p| !p.is_empty())
                    .map(str::to_string),
            );
        }
    }
    (cases, phases)
}

/// The table a ledger belongs to: each crash point's group in the reference move's order, and
/// the number of cases (FNV-1a, the same on every toolchain). A change of the move's steps
/// moves the points, and a case's number then means another case.
pub fn fingerprint(point_groups: &[String], cases: usize) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in point_groups
        .join("\n")
        .bytes()
        .chain(cases.to_string().bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

/// The ledger's line naming its table.
pub fn ledger_table_line(fingerprint: &str) -> String {
    format!("table {fingerprint}\n")
}

/// Whether `ledger` is for the table `fingerprint`: `Ok(true)` where it says so, `Ok(false)`
/// where it names none (empty, or written before ledgers named their table: taken as this
/// one's), an error where it names another.
pub fn ledger_is_for(ledger: &str, fingerprint: &str) -> Result<bool, String> {
    let mut named = false;
    for t in ledger.lines().filter_map(|l| l.strip_prefix("table ")) {
        if t.trim() != fingerprint {
            return Err(format!(
                "the ledger is for another table ({}; this one is {fingerprint}): the move's steps or its crash points changed since, so its case numbers mean other cases now. Start a new ledger.",
                t.trim()
            ));
        }
        named = true;
    }
    Ok(named)
}

/// The line the ledger gets for a case that passed.
pub fn ledger_line(c: usize, secs: f64, phases: &[String], outcome: &str) -> String {
    format!(
        "case {c} passed in {secs:.1}s [phases: {}]: {outcome}\n",
        phases.join(", ")
    )
}

/// A run's half of `chosen`: the suite runs two halves at once, each on clusters of its own.
pub fn half(chosen: Vec<usize>, half: usize) -> Vec<usize> {
    chosen
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == half)
        .map(|(_, c)| c)
        .collect()
}

/// One run's cases, per group: `k` of each group, the next ones in turn for each `seed`.
pub fn per_group(groups: &[(String, Vec<usize>)], k: usize, seed: usize) -> Vec<usize> {
    let mut out: Vec<usize> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, (_, cases))| {
            // The group's number shifts its turn, so that one run takes both ways.
            (0..k.min(cases.len())).map(move |j| cases[(seed * k + g + j) % cases.len()])
        })
        .collect();
    out.sort_unstable();
    out
}

#[test]
fn every_point_has_both_ways_and_both_chains_and_clusterctl_dies_alone_last() {
    let t = table(3);
    assert_eq!(t.len(), (3 + 2) * 4);
    assert_eq!(
        t[0],
        Case {
            kill: Kill::At(0),
            then: Then::Rerun,
            chain: 1
        }
    );
    assert_eq!(t[3].then, Then::Abort);
    assert_eq!(t[3].chain, 2);
    assert_eq!(t[12].kill, Kill::ClusterctlAlone { in_fail: false });
    assert_eq!(t[19].kill, Kill::ClusterctlAlone { in_fail: true });
}

#[test]
fn a_run_takes_a_case_of_every_group_and_turns_through_each_group() {
    let t = table(3);
    let point_groups = ["StopTarget", "StopTarget", "Hold"].map(String::from);
    let g = groups(&t, &point_groups);
    let names: Vec<&str> = g.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["StopTarget", "Hold", CLUSTERCTL_ALONE]);
    assert_eq!(g[0].1.len(), 8);
    for seed in 0..20 {
        let run = per_group(&g, 1, seed);
        assert_eq!(run.len(), 3, "{run:?}");
        for (_, cases) in &g {
            assert_eq!(run.iter().filter(|c| cases.contains(c)).count(), 1);
        }
    }
    // Over as many runs as a group has cases, every case of it is taken.
    let taken: BTreeSet<usize> = (0..8).flat_map(|s| per_group(&g, 1, s)).collect();
    assert!(g[0].1.iter().all(|c| taken.contains(c)), "{taken:?}");
    // Both ways in one run.
    let run = per_group(&g, 1, 0);
    let ways: BTreeSet<_> = run.iter().map(|c| t[*c].then as u8).collect();
    assert_eq!(ways.len(), 2, "{run:?}");
}

#[test]
fn crash_only_names_cases_in_range() {
    assert_eq!(only_cases("4, 17,", 246), Ok(vec![4, 17]));
}

#[test]
fn crash_selections_that_would_run_nothing_or_something_else_are_errors() {
    assert_eq!(
        only_cases("4,246", 246).unwrap_err(),
        "HANDOFF_CRASH_ONLY=4,246: [246] out of range: this run has 246 cases, 0 to 245"
    );
    for none in ["", " ", ",", " , "] {
        assert!(
            only_cases(none, 246).unwrap_err().contains("names no case"),
            "{none:?}"
        );
    }
    assert!(only_cases("4,x", 246).unwrap_err().contains("\"x\""));
    assert_eq!(case_count(None), Ok(CaseCount::PerGroup(1)));
    assert_eq!(case_count(Some("")), Ok(CaseCount::PerGroup(1)));
    assert_eq!(case_count(Some("3")), Ok(CaseCount::PerGroup(3)));
    assert_eq!(case_count(Some("all")), Ok(CaseCount::All));
    assert!(case_count(Some("0")).unwrap_err().contains("runs no case"));
    for bad in ["al", "-1", "two", "1.5"] {
        let why = case_count(Some(bad)).unwrap_err();
        assert!(why.contains(bad) && why.contains("not a count"), "{why}");
    }
    assert_eq!(shard("2/8"), Ok((2, 8)));
    for bad in ["8/8", "1/0", "1", "a/b", ""] {
        assert!(shard(bad).unwrap_err().contains("i/n"), "{bad:?}");
    }
}

#[test]
fn the_ledger_resumes_where_the_passed_cases_end() {
    let phases = |p: &[&str]| p.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let ledger = ledger_line(4, 41.0, &phases(&["Copying", "Aborting"]), "ok")
        + "case 9 failed\n"
        + &ledger_line(17, 3.0, &phases(&[]), "x")
        + &ledger_line(18, 3.0, &phases(&["none"]), "x");
    let (cases, met) = passed(&ledger);
    assert_eq!(cases, BTreeSet::from([4, 17, 18]));
    assert_eq!(
        met,
        ["Aborting", "Copying", "none"].map(String::from).into()
    );
}

#[test]
fn the_two_halves_take_every_case_once() {
    let chosen = vec![3, 8, 9, 20, 31];
    assert_eq!(half(chosen.clone(), 0), [3, 9, 31]);
    assert_eq!(half(chosen, 1), [8, 20]);
}

#[test]
fn a_ledger_for_another_table_is_refused() {
    let groups = |g: &[&str]| g.iter().map(|g| g.to_string()).collect::<Vec<_>>();
    let fp = fingerprint(&groups(&["StopTarget", "Hold", "RunClusterctl"]), 20);
    assert_eq!(
        fp,
        fingerprint(&groups(&["StopTarget", "Hold", "RunClusterctl"]), 20)
    );
    for other in [
        fingerprint(&groups(&["StopTarget", "Hold", "StopSource"]), 20),
        fingerprint(&groups(&["StopTarget", "Hold", "RunClusterctl"]), 24),
    ] {
        assert_ne!(fp, other);
        let ledger = ledger_table_line(&other) + "case 4 passed in 90.0s [phases: none]: x\n";
        assert!(ledger_is_for(&ledger, &fp).is_err());
    }
    assert_eq!(ledger_is_for("", &fp), Ok(false));
    assert_eq!(
        ledger_is_for("case 4 passed in 90.0s [phases: none]: x\n", &fp),
        Ok(false)
    );
    let ours = ledger_table_line(&fp) + &ledger_table_line(&fp);
    assert_eq!(ledger_is_for(&ours, &fp), Ok(true));
}
