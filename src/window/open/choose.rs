//! What `handoff window open` will do, read without writing anything: the selector and stop
//! policy in force, how each selected Deployment is stopped, and `plan_open`, which prints it
//! for a dry run.

use crate::window::progress::Progress;
use std::collections::BTreeMap;

use super::OpenOptions;
use crate::resources::move_window::{MoveWindowSpec, PinnedDeployment, StopPolicy};
use crate::rules::move_window::SAVED_REPLICAS_ANNOTATION;
use crate::rules::selector::Selector;
use crate::window::cluster::lease;
use crate::window::cluster::preflight::{self, preflight};
use crate::window::cluster::{
    Cluster, Finding, Result, WindowError, dep_key, read_window, selected_deployments,
};
use crate::window::plan::proof;
use crate::window::plan::stop::{self, LeaseSeen, PinPlan, StopChoice};

/// How `open` will stop one selected Deployment on one cluster.
#[derive(Debug, Clone)]
pub struct Choice {
    pub namespace: String,
    pub name: String,
    /// `spec.replicas` now.
    pub replicas: i32,
    /// Its pods' `terminationGracePeriodSeconds` (Kubernetes' default: 30).
    pub grace: i64,
    pub plan: Stop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// These Leases, as seen now.
    Lease(Vec<LeaseSeen>),
    Scale(PinPlan),
}

impl Choice {
    pub fn what(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Whether the preflight's `finding` is about a Deployment stopped by Lease (its webhooks keep
/// serving).
pub fn leased(choices: &[Choice], finding: &Finding) -> bool {
    choices
        .iter()
        .any(|ch| ch.what() == finding.deployment && matches!(ch.plan, Stop::Lease(_)))
}

/// Read what `open` needs to choose, and choose (nothing is written): every selected
/// Deployment, the Leases of their namespaces, and what the window already recorded.
pub async fn choose(
    c: &Cluster,
    opts: &OpenOptions,
    progress: &mut Progress,
) -> Result<(Selector, StopPolicy, Vec<Choice>)> {
    let (selector, policy, recorded) = in_force(c, opts).await?;
    let deployments = selected_deployments(c, &selector, &opts.own).await?;
    let mut by_ns: BTreeMap<String, Vec<LeaseSeen>> = BTreeMap::new();
    let mut out = Vec::new();
    for d in deployments {
        let (ns, name) = dep_key(&d);
        if !by_ns.contains_key(&ns) {
            by_ns.insert(ns.clone(), lease::leases_in(c, &ns).await?);
        }
        let rec = recorded
            .iter()
            .find(|p| p.namespace == ns && p.name == name);
        let mut claims = stop::claims(&name, &by_ns[&ns], &opts.name);
        if claims.is_empty() && rec.is_none() && policy != StopPolicy::Scale {
            claims = await_candidate(c, opts, &ns, &name, &mut by_ns, progress).await?;
        }
        let leases = &by_ns[&ns];
        let what = format!("{ns}/{name}");
        let stop = match stop::choose_stop(policy, &what, rec, &claims) {
            StopChoice::Refuse(why) => {
                return Err(WindowError::StopRefused {
                    cluster: c.label.into(),
                    deployment: None,
                    why: Box::new(why),
                });
            }
            StopChoice::Scale => Stop::Scale(stop::pin_plan(&d)),
            StopChoice::Lease(names) => {
                let mut seen = Vec::new();
                for n in names {
                    match leases.iter().find(|l| l.name == n) {
                        Some(l) => seen.push(l.clone()),
                        // Recorded by an earlier run, deleted since: a candidate re-creates
                        // it, and the next run takes it from there.
                        None => {
                            return Err(WindowError::Refused {
                                cluster: c.label.into(),
                                message: format!(
                                    "{what}: the window recorded Lease {ns}/{n}, which no longer exists; wait until a replica re-creates it (it leads meanwhile) and run the command again"
                                ),
                            });
                        }
                    }
                }
                Stop::Lease(seen)
            }
        };
        out.push(Choice {
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            grace: d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30),
            namespace: ns,
            name,
            plan: stop,
        });
    }
    Ok((selector, policy, out))
}

/// A Lease released moments ago (a move's source, a window closed just before) names no
/// holder until a candidate takes it: waited for, or the Deployment would be chosen as one
/// without leader election. The Deployment's claims once one holds it (`by_ns` read again).
async fn await_candidate(
    c: &Cluster,
    opts: &OpenOptions,
    ns: &str,
    name: &str,
    by_ns: &mut BTreeMap<String, Vec<LeaseSeen>>,
    progress: &mut Progress,
) -> Result<Vec<stop::Claim>> {
    let mut said = false;
    let mut claims = Vec::new();
    while let Some((l, until)) = by_ns[ns].iter().find_map(|l| {
        stop::awaits_candidate(l, k8s_openapi::jiff::Timestamp::now()).map(|u| (l, u))
    }) {
        if !said {
            progress.say(format!(
                "{}: Lease {ns}/{} was released moments ago and no candidate holds it yet; waiting for one to take it (until {until} at the latest), to tell whose it is",
                c.label, l.name
            ));
            said = true;
        }
        tokio::time::sleep(RELEASED_POLL).await;
        by_ns.insert(ns.to_string(), lease::leases_in(c, ns).await?);
        claims = stop::claims(name, &by_ns[ns], &opts.name);
        if !claims.is_empty() {
            break;
        }
    }
    Ok(claims)
}

/// How long the proof of a stop by Lease is expected to wait after the take-over, as a dry
/// run reads it: the slowest of the Leases it would take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProofWait {
    /// By the proof each former leader is expected to get (`proof::expected`).
    pub expected: i64,
    /// By the Leases' bounds (the longest former lease duration).
    pub at_latest: i64,
}

/// How often the Leases of a namespace are read while one released moments ago awaits a
/// candidate (a candidate takes it within seconds).
const RELEASED_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// What `open` would do on each cluster, read without writing anything: the preflight, the
/// window it would create or re-open, and how it would stop each Deployment. Returns how long
/// the proof would wait.
pub async fn plan_open(
    clusters: &[Cluster],
    opts: &OpenOptions,
    out: &mut Progress,
) -> Result<ProofWait> {
    let mut wait = ProofWait::default();
    for c in clusters {
        let (selector, policy, choices) = choose(c, opts, out).await?;
        let findings = preflight(c, &selector, &opts.own).await?;
        let window = match &read_window(c, &opts.name).await? {
            None => format!("would create MoveWindow {} (Open)", opts.name),
            Some(w) if w.spec.is_open() => format!("MoveWindow {} is already open", opts.name),
            Some(_) => format!("would re-open MoveWindow {}", opts.name),
        };
        out.say(format!(
            "{}: {window}, selecting {selector}, stopping by {policy:?}",
            c.label
        ));
        let (served, down): (Vec<Finding>, Vec<Finding>) =
            findings.into_iter().partition(|f| leased(&choices, f));
        for line in preflight::by_deployment(&served) {
            out.say(format!(
                "preflight: {line} (stopped by Lease: its webhooks keep serving)"
            ));
        }
        let verdict = match opts.allow_webhook_outage {
            true => "allowed by --allow-webhook-outage",
            false => "open would refuse without --allow-webhook-outage",
        };
        for line in preflight::by_deployment(&down) {
            out.say(format!("preflight: {line} ({verdict})"));
        }
        if choices.is_empty() {
            out.say(format!("{}: no Deployment matches {selector}", c.label));
        }
        for ch in &choices {
            let standby = opts.standby && stop::needs_standby(ch.replicas, None);
            if let Stop::Lease(leases) = &ch.plan {
                for l in leases.iter().filter(|l| l.window().is_none()) {
                    let bound = l.duration.unwrap_or(stop::DEFAULT_LEASE_SECONDS);
                    wait.at_latest = wait.at_latest.max(i64::from(bound));
                    wait.expected = wait.expected.max(expected(ch, l, standby).within);
                }
            }
            let what = planned(ch, standby);
            out.say(format!("{}: {}: {what}", c.label, ch.what()));
        }
    }
    out.say("dry run: nothing was written");
    Ok(wait)
}

/// The proof a Lease's former leader is expected to get.
fn expected(ch: &Choice, l: &LeaseSeen, standby: bool) -> proof::Expected {
    proof::expected(
        &l.holder,
        &ch.name,
        // A Ready pod stays: another replica, or the standby; so the leader's is deleted.
        standby || ch.replicas >= 2,
        ch.grace,
        l.duration.unwrap_or(stop::DEFAULT_LEASE_SECONDS),
    )
}

/// What `open` would do to one Deployment, said; `standby`: a standby replica comes first.
fn planned(ch: &Choice, standby: bool) -> String {
    let standby = match (&ch.plan, standby) {
        (Stop::Lease(_), true) => "add a standby replica (1 → 2, back to 1 on close), then ",
        _ => "",
    };
    match &ch.plan {
        Stop::Lease(leases) => leases
            .iter()
            .map(|l| match l.window() {
                Some(_) => format!(
                    "Lease: {} already held (taken from {})",
                    l.name,
                    l.former_holder.as_deref().unwrap_or("?")
                ),
                None => format!(
                    "Lease: would hold {} (held by {}, leaseDurationSeconds {}; {})",
                    l.name,
                    if l.holder.is_empty() {
                        "nobody"
                    } else {
                        &l.holder
                    },
                    l.duration.unwrap_or(stop::DEFAULT_LEASE_SECONDS),
                    expected(ch, l, !standby.is_empty()).said
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
            .replacen(
                "Lease: would hold",
                &format!("Lease: would {standby}hold"),
                1,
            ),
        Stop::Scale(PinPlan::AlreadyPinned(s)) => {
            format!("Scale: already pinned (restores to {s})")
        }
        Stop::Scale(PinPlan::PinnedUnreadable) => format!(
            "Scale: already at 0 with an unreadable {SAVED_REPLICAS_ANNOTATION} (close would restore 1)"
        ),
        Stop::Scale(PinPlan::Save(0)) => "Scale: already at 0: would save 0".to_string(),
        Stop::Scale(PinPlan::Save(n)) => {
            format!("Scale: would pin to 0 replicas, saving {n}")
        }
    }
}

/// What `open` will act by on this cluster, read without writing anything: the selector and
/// stop policy in force (an existing window's own, else the flags, else the defaults) and what
/// the window already recorded.
pub async fn in_force(
    c: &Cluster,
    opts: &OpenOptions,
) -> Result<(Selector, StopPolicy, Vec<PinnedDeployment>)> {
    let refused = |message: String| WindowError::Refused {
        cluster: c.label.into(),
        message,
    };
    let Some(w) = read_window(c, &opts.name).await? else {
        let selector = match &opts.selector {
            Some(sel) => Selector::from_label_selector(sel)
                .map_err(|e| refused(format!("--selector: {e}")))?,
            None => MoveWindowSpec::default_selector(),
        };
        return Ok((selector, opts.stop.unwrap_or_default(), vec![]));
    };
    if let Some(sel) = &opts.selector
        && w.spec.deployment_selector.as_ref() != Some(sel)
    {
        return Err(refused(format!(
            "MoveWindow {} already exists with another deploymentSelector; close it and delete it, or open it without --selector",
            opts.name
        )));
    }
    let policy = w.spec.stop.unwrap_or_default();
    if let Some(stop) = opts.stop
        && stop != policy
    {
        return Err(refused(format!(
            "MoveWindow {} already exists with spec.stop {policy:?}; close it and delete it, or open it without --stop",
            opts.name
        )));
    }
    let selector = w
        .spec
        .selector()
        .map_err(|e| refused(format!("MoveWindow {}: {e}", opts.name)))?;
    // A window closed since recorded history, not a plan to finish.
    let recorded = match w.spec.is_open() {
        true => w.status.map(|s| s.pinned).unwrap_or_default(),
        false => vec![],
    };
    Ok((selector, policy, recorded))
}
