//! `handoff window open`: choose how each selected Deployment is stopped, stop it, and prove
//! it stopped. This file is the order of it, on every cluster at once; `choose` reads and
//! decides, `by_lease` and `by_scale` stop.

mod by_lease;
mod by_scale;
mod choose;
mod driver;
mod proven;

use crate::window::progress::Progress;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::PostParams;

use crate::resources::move_window::{
    MoveWindow, MoveWindowSpec, MoveWindowStatus, PinnedDeployment, StopPolicy, Strategy,
    WindowState,
};
use crate::resources::phase::WindowPhase;
use crate::rules::move_window::OwnDeployment;
use crate::rules::selector::Selector;
use crate::window::cluster::installed;
use crate::window::cluster::lease;
use crate::window::cluster::preflight::{self, preflight};
use crate::window::cluster::standby;
use crate::window::cluster::window_webhook;
use crate::window::cluster::{
    Cluster, Result, WindowError, api_err, labels, now, pinned_mut, read_window, record, set_state,
    upsert_pinned,
};
use crate::window::plan::stop;
use by_lease::{Held, bound, leased_record, take_leases};
use by_scale::{pin_deployment, wait_pods_gone, wait_policy_in_force};
pub use choose::Choice;
pub use choose::plan_open;
use choose::{Stop, choose, leased};
pub use driver::{open, take};
use k8s_openapi::jiff::Timestamp;

/// How often `open` reads what it waits for (pods gone, a Lease's holder).
pub const OPEN_POLL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub name: String,
    pub selector: Option<LabelSelector>,
    pub reason: Option<String>,
    pub allow_webhook_outage: bool,
    /// How long to wait for the pinned pods to be gone; zero skips the wait.
    pub wait_timeout: Duration,
    pub poll: Duration,
    pub own: OwnDeployment,
    /// `--stop`: `None` keeps an existing window's, or `Auto` for a new one.
    pub stop: Option<StopPolicy>,
    /// Add a standby replica to a single-replica Deployment before its Lease is taken
    /// (`--no-standby` turns it off).
    pub standby: bool,
    /// The preflight was said already (`handoff move` checks both clusters first).
    pub quiet_preflight: bool,
}

/// Create the window, or re-open an existing one, recording the Lease-stopped Deployments in
/// the same status write (so that neither the pin nor its policy scales them); returns whether
/// the pin's admission policies are bound to it, and the status as recorded.
async fn ensure_open(
    c: &Cluster,
    opts: &OpenOptions,
    window: Option<MoveWindow>,
    fresh: bool,
    leased: &[PinnedDeployment],
    scaled: &[(String, String)],
    out: &mut Progress,
) -> Result<(bool, MoveWindowStatus)> {
    // `checked` refused an existing window whose selector or stop policy the flags contradict.
    // A window is created (or re-opened) Closed, its Lease-stopped Deployments recorded, and
    // only then set Open: a pin that sees it open always sees which ones not to scale.
    let (spec, was_open) = window_at_least_closed(c, opts, window).await?;
    if was_open {
        out.say(format!(
            "{}: MoveWindow {} is already open",
            c.label, opts.name
        ));
    }
    // Recorded before the pin's policies are bound: their condition reads the strategies.
    let status = record(c, &opts.name, |s| {
        // A new opening: what an earlier window recorded about its pods no longer holds.
        if fresh {
            s.pods_gone_at = None;
            s.opened_at = None;
        }
        if s.phase != Some(WindowPhase::Open) {
            s.phase = Some(WindowPhase::Opening);
        }
        s.opened_at.get_or_insert_with(now);
        s.closed_at = None;
        s.last_step = Some("window-open".into());
        for p in leased {
            merge_leased(s, p.clone());
        }
    })
    .await?;
    let labels = spec
        .deployment_selector
        .clone()
        .unwrap_or_else(crate::resources::move_window::default_deployment_selector);
    let pin_needed = guard_before_open(c, opts, &labels, leased, scaled, out).await?;
    if !was_open {
        set_state(c, &opts.name, WindowState::Open).await?;
        out.say(format!("{}: MoveWindow {} is Open", c.label, opts.name));
    }
    let bound = bind_pin_policies(c, opts, &labels, out).await?;
    // Either way the API server pins: `pin_scaled` waits until it does.
    Ok((bound || pin_needed, status))
}

/// Where nothing of handoff guards this cluster, the window's own policies, before it opens
/// and before any Lease is taken; whether they pin. Then the window's webhook configuration:
/// from its opening on, what it stops fails closed at the API server, and only that
/// (`window_webhook`).
async fn guard_before_open(
    c: &Cluster,
    opts: &OpenOptions,
    labels: &LabelSelector,
    leased: &[PinnedDeployment],
    scaled: &[(String, String)],
    out: &mut Progress,
) -> Result<bool> {
    let needs = installed::needs(
        &installed::survey(c).await?,
        !leased.is_empty(),
        !scaled.is_empty(),
    );
    let put = installed::ensure_guards(c, &opts.name, labels, &needs).await?;
    if !put.is_empty() {
        out.say(format!(
            "{}: nothing of handoff guards this cluster; MoveWindow {} brings its own until it closes: {}",
            c.label,
            opts.name,
            put.join(", ")
        ));
    }
    let uid = c.window_uid(&opts.name);
    if window_webhook::put(&c.client, &opts.name, uid.as_deref(), labels, scaled)
        .await
        .map_err(api_err(
            c,
            format!("writing MoveWindow {}'s webhook configuration", opts.name),
        ))?
    {
        out.detail(format!(
            "{}: MutatingWebhookConfiguration {}: the Deployments it selects{} fail closed while it is open",
            c.label,
            window_webhook::name(&opts.name),
            match scaled.is_empty() {
                true => "",
                false => " and the scale of those it pins",
            }
        ));
    }
    Ok(needs.pin)
}

/// With the pin's admission policies installed, the window binds them too, so that it pins
/// inside the API server even while no handoff replica runs; whether it did.
async fn bind_pin_policies(
    c: &Cluster,
    opts: &OpenOptions,
    labels: &LabelSelector,
    out: &mut Progress,
) -> Result<bool> {
    let bound = crate::admission_policy::apply::pin_installed(&c.client)
        .await
        .map_err(api_err(c, "reading the MutatingAdmissionPolicy"))?;
    if bound {
        crate::admission_policy::apply::bind_window(&c.client, &opts.name, labels)
            .await
            .map_err(api_err(
                c,
                format!(
                    "binding the pin's admission policies to MoveWindow {}",
                    opts.name
                ),
            ))?;
        out.detail(format!(
            "{}: bound the pin's MutatingAdmissionPolicies to MoveWindow {}",
            c.label, opts.name
        ));
    }
    Ok(bound)
}

/// The window's spec (as `read`), created Closed where there is none yet; and whether it is
/// open.
pub(crate) async fn window_at_least_closed(
    c: &Cluster,
    opts: &OpenOptions,
    read: Option<MoveWindow>,
) -> Result<(MoveWindowSpec, bool)> {
    Ok(match read {
        None => {
            installed::ensure_crd(c, &opts.name).await?;
            let spec = MoveWindowSpec {
                state: WindowState::Closed,
                deployment_selector: opts.selector.clone(),
                reason: opts.reason.clone(),
                role: c.role,
                stop: opts.stop,
            };
            Api::<MoveWindow>::all(c.client.clone())
                .create(
                    &PostParams::default(),
                    &MoveWindow::new(&opts.name, spec.clone()),
                )
                .await
                .map_err(api_err(c, format!("creating MoveWindow {}", opts.name)))?;
            (spec, false)
        }
        Some(w) => {
            let open = w.spec.is_open();
            (w.spec, open)
        }
    })
}

/// Before a window opens: a standby for each single-replica Deployment it will stop by Lease,
/// recorded in the window (created Closed where there is none: it pins nothing and stops
/// nothing). `handoff move` adds the source's before clusterctl starts, so that they are Ready
/// by the time clusterctl has paused the source; `take` finds them recorded, adds none, and
/// waits until they are Ready before it takes a Lease.
pub async fn ready_standbys(c: &Cluster, opts: &OpenOptions, out: &mut Progress) -> Result<()> {
    if !opts.standby {
        return Ok(());
    }
    // Chosen as `take` will choose (the caller ran the preflight already).
    let (_, _, choices) = choose(c, opts, out).await?;
    let leased: Vec<&Choice> = choices
        .iter()
        .filter(|ch| matches!(ch.plan, Stop::Lease(_)))
        .collect();
    if !leased
        .iter()
        .any(|ch| stop::needs_standby(ch.replicas, None))
    {
        return Ok(());
    }
    window_at_least_closed(c, opts, read_window(c, &opts.name).await?).await?;
    let records: Vec<PinnedDeployment> = choices.iter().filter_map(leased_record).collect();
    let status = record(c, &opts.name, |s| {
        for p in &records {
            merge_leased(s, p.clone());
        }
        s.last_step = Some("standbys".into());
    })
    .await?;
    add_standbys(c, opts, &leased, &status, false, out).await
}

/// Record a Lease-stopped Deployment, keeping what an earlier run recorded of its Leases (the
/// former holders, when they were taken).
fn merge_leased(s: &mut MoveWindowStatus, mut p: PinnedDeployment) {
    if let Some(old) = s
        .pinned
        .iter()
        .find(|o| o.namespace == p.namespace && o.name == p.name && o.restored_at.is_none())
    {
        for l in &mut p.leases {
            if let Some(o) = old
                .leases
                .iter()
                .find(|o| o.name == l.name && o.released_at.is_none())
            {
                *l = o.clone();
            }
        }
        p.stopped_since = old.stopped_since.clone();
        // A standby added by an earlier run: the count to go back to is the one before it.
        if old.standby {
            p.standby = true;
            p.saved_replicas = old.saved_replicas;
        }
    }
    upsert_pinned(s, p);
}

/// What `open` checks before it writes anything, on every cluster: how each Deployment would
/// be stopped, and the preflight (a Scale-stopped Deployment behind a fail-closed webhook is
/// refused unless `--allow-webhook-outage`). `handoff move` runs it for both clusters before
/// it starts.
pub async fn check(clusters: &[Cluster], opts: &OpenOptions, out: &mut Progress) -> Result<()> {
    checked(clusters, opts, out).await.map(|_| ())
}

type Chosen = (Selector, StopPolicy, Vec<Choice>);

/// Each cluster's choice, and the fail-closed webhook Services its Lease-stopped Deployments
/// back (`namespace/name`), which must keep a ready endpoint.
async fn checked(
    clusters: &[Cluster],
    opts: &OpenOptions,
    out: &mut Progress,
) -> Result<Vec<(Chosen, Vec<String>)>> {
    // The name becomes a label value on held Leases (at most 63 characters), refused now
    // rather than after the first Deployment is stopped.
    if opts.name.len() > 63 {
        return Err(WindowError::Refused {
            cluster: labels(clusters),
            message: format!(
                "MoveWindow name {:?} is {} characters; at most 63 (it labels the Leases a window holds)",
                opts.name,
                opts.name.len()
            ),
        });
    }
    let mut chosen = Vec::new();
    for c in clusters {
        chosen.push(choose(c, opts, out).await?);
    }
    let mut findings = Vec::new();
    let mut all = Vec::new();
    for (c, chosen) in clusters.iter().zip(chosen) {
        let (selector, _, choices) = &chosen;
        let mut served = Vec::new();
        for f in preflight(c, selector, &opts.own).await? {
            if leased(choices, &f) {
                served.push(f);
            } else {
                findings.push(f);
            }
        }
        if !opts.quiet_preflight {
            for line in preflight::by_deployment(&served) {
                out.say(format!(
                    "{line}: stopped by Lease, its webhooks keep serving"
                ));
            }
        }
        if !opts.quiet_preflight {
            let stops = |lease: bool| {
                choices
                    .iter()
                    .any(|ch| matches!(ch.plan, Stop::Lease(_)) == lease)
            };
            let n = installed::needs(&installed::survey(c).await?, stops(true), stops(false));
            for u in &n.unguarded {
                out.warn(format!(
                    "{}: unguarded while MoveWindow {} is open: {u}",
                    c.label, opts.name
                ));
            }
        }
        let mut services: Vec<String> = served.into_iter().map(|f| f.service).collect();
        services.sort();
        services.dedup();
        all.push((chosen, services));
    }
    if !findings.is_empty() {
        if !opts.allow_webhook_outage {
            return Err(WindowError::Preflight(findings));
        }
        if !opts.quiet_preflight {
            for line in preflight::by_deployment(&findings) {
                out.warn(format!("{line} (allowed by --allow-webhook-outage)"));
            }
        }
    }
    Ok(all)
}

/// What `take` stopped on one cluster and `prove` has yet to prove.
pub struct Taken {
    cluster: Cluster,
    opts: OpenOptions,
    /// Lease-stopped Deployments, their Leases as held, each with the watch of its former
    /// holder's Pod.
    leased: Vec<(Choice, Vec<Held>)>,
    /// Scale-stopped Deployments.
    scaled: Vec<(String, String)>,
    /// The fail-closed webhook Services the Lease-stopped Deployments back.
    services: Vec<String>,
    started: tokio::time::Instant,
}

impl Taken {
    /// When every former leader here is proven stopped at the latest (now, where none was):
    /// the latest Lease bound; the kubelet's report of their ends may prove it sooner.
    pub fn bound(&self) -> Timestamp {
        self.leased
            .iter()
            .map(|(_, h)| bound(h))
            .max()
            .unwrap_or_else(Timestamp::now)
    }
}

/// The earliest take-over of a Lease in any of these, as recorded (a re-run keeps the first),
/// RFC 3339; now where none was recorded.
pub fn first_taken(taken: &[Taken]) -> String {
    taken
        .iter()
        .flat_map(|t| t.leased.iter().flat_map(|(_, held)| held))
        .filter_map(|h| h.lease.held_since.as_deref()?.parse::<Timestamp>().ok())
        .min()
        .map(|t| t.to_string())
        .unwrap_or_else(now)
}

/// Pin each Scale-stopped Deployment to 0, recorded with the count it had; where the pin's
/// admission policies are bound, wait until they are in force.
async fn pin_scaled(
    c: &Cluster,
    opts: &OpenOptions,
    choices: &[Choice],
    bound: bool,
    out: &mut Progress,
) -> Result<Vec<(String, String)>> {
    let mut keys = Vec::new();
    for ch in choices {
        let Stop::Scale(_) = &ch.plan else {
            continue;
        };
        let (ns, name) = (ch.namespace.clone(), ch.name.clone());
        let saved = pin_deployment(c, &ns, &name, out).await?;
        record(c, &opts.name, |s| {
            upsert_pinned(
                s,
                PinnedDeployment {
                    namespace: ns.clone(),
                    name: name.clone(),
                    strategy: Some(Strategy::Scale),
                    saved_replicas: saved,
                    ..PinnedDeployment::default()
                },
            );
            s.last_step = Some(format!("pinned {ns}/{name}"));
        })
        .await?;
        keys.push((ns, name));
    }
    if let (true, Some(first)) = (bound, keys.first()) {
        wait_policy_in_force(c, first, out).await?;
    }
    Ok(keys)
}

/// Add a standby replica to each single-replica Lease-stopped Deployment (recorded before it
/// is written), and, with `wait`, wait until every standby (added now or by an earlier run) is
/// Ready: only then is a Lease taken, so that its webhooks keep a pod while the former leader
/// exits.
async fn add_standbys(
    c: &Cluster,
    opts: &OpenOptions,
    leased: &[&Choice],
    status: &MoveWindowStatus,
    wait: bool,
    out: &mut Progress,
) -> Result<()> {
    let mut standbys = Vec::new();
    let mut added = Vec::new();
    for ch in leased {
        let rec = status
            .pinned
            .iter()
            .find(|p| p.namespace == ch.namespace && p.name == ch.name);
        if let Some(p) = rec.filter(|p| p.standby && p.restored_at.is_none()) {
            // Recorded, and maybe not there: a run that died between the record and the
            // scale, a close that scaled back and died, a GitOps tool that reverted it.
            if ch.replicas <= p.saved_replicas {
                standby::scale(c, &ch.namespace, &ch.name, p.saved_replicas + 1).await?;
                added.push(ch.what());
            }
            standbys.push((*ch, p.saved_replicas + 1));
            continue;
        }
        if !stop::needs_standby(ch.replicas, rec) {
            continue;
        }
        record(c, &opts.name, |s| {
            if let Some(p) = pinned_mut(s, &ch.namespace, &ch.name) {
                p.standby = true;
                p.saved_replicas = ch.replicas;
            }
            s.last_step = Some(format!("standby for {}", ch.what()));
        })
        .await?;
        standby::scale(c, &ch.namespace, &ch.name, ch.replicas + 1).await?;
        added.push(ch.what());
        standbys.push((*ch, ch.replicas + 1));
    }
    if !added.is_empty() {
        out.say(format!("{}: a standby replica (1 → 2), so that the webhooks keep a Ready pod while the leader goes: {}",
            c.label,
            added.join(", ")));
    }
    if !wait {
        return Ok(());
    }
    for (ch, want) in &standbys {
        if let standby::Proof::Unreported(why) = standby::wait_ready(
            c,
            &ch.namespace,
            &ch.name,
            *want,
            SERVING_TIMEOUT,
            opts.poll.min(FAST_POLL),
        )
        .await?
        {
            out.warn(format!(
                "{why}; its Lease is taken without knowing that its standby is Ready"
            ));
        }
    }
    Ok(())
}

/// How long a standby may take to be Ready, and a webhook Service to have a ready endpoint.
pub const SERVING_TIMEOUT: Duration = Duration::from_secs(180);
const FAST_POLL: Duration = Duration::from_millis(500);

/// The second half of `open`, for every cluster `take` stopped at once: wait until every
/// former leader is proven stopped (`proven`: its end reported by the kubelet, or its bound), check that every Lease is still
/// the window's and that the Lease-stopped controllers serve (a Ready pod, their webhook
/// Services a ready endpoint), and wait for the pinned pods to be gone.
pub async fn prove(taken: &[Taken], out: &mut Progress) -> Result<()> {
    let proofs = proven::wait(taken, out).await;
    for (t, proofs) in taken.iter().zip(&proofs) {
        proven::record_proofs(t, proofs, out).await?;
    }
    for t in taken {
        let deployments: Vec<(String, String)> = t
            .leased
            .iter()
            .map(|(ch, _)| (ch.namespace.clone(), ch.name.clone()))
            .collect();
        let poll = t.opts.poll.min(FAST_POLL);
        for why in
            standby::wait_serving(&t.cluster, &deployments, &t.services, SERVING_TIMEOUT, poll)
                .await?
        {
            out.warn(why);
        }
    }
    // Every cluster's pinned pods, waited for at once.
    if let Some(t) = taken.first().filter(|t| !t.opts.wait_timeout.is_zero()) {
        let scaled: Vec<(Cluster, Vec<(String, String)>)> = taken
            .iter()
            .map(|t| (t.cluster.clone(), t.scaled.clone()))
            .collect();
        wait_pods_gone(&scaled, &t.opts, out).await?;
    }
    // Last, right before the callers rely on it (`handoff move` lifts its block-move next).
    for t in taken {
        still_held(t).await?;
    }
    for (t, proofs) in taken.iter().zip(&proofs) {
        proven::record_proven(t, proofs, out).await?;
    }
    if let Some(started) = taken.iter().map(|t| t.started).min() {
        out.say(format!(
            "every selected controller proven stopped in {:.1}s",
            started.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

/// Every Lease still the window's, by its holder: one taken back means its controllers may
/// be running.
async fn still_held(t: &Taken) -> Result<()> {
    let c = &t.cluster;
    for (ch, held) in &t.leased {
        for Held { lease: h, .. } in held {
            let Some(holder) = lease::taken_from(c, &ch.namespace, &h.name, &t.opts.name).await?
            else {
                continue;
            };
            return Err(WindowError::Refused {
                cluster: c.label.into(),
                message: format!(
                    "{}: Lease {}/{} was taken back by {} while MoveWindow {} held it, so its controllers may be running: the same command again takes it again and proves it anew",
                    ch.what(),
                    ch.namespace,
                    h.name,
                    if holder.is_empty() {
                        "nobody (written free by someone)"
                    } else {
                        &holder
                    },
                    t.opts.name
                ),
            });
        }
    }
    Ok(())
}
