//! The way back in `handoff move`: each cluster's window closed in order, what clusterctl
//! paused unpaused, and what is reported at the end of a move and of an `--abort`.

use crate::window::progress::Progress;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tokio::time::Instant;

use super::cluster_api::{self, CLUSTER_CLASSES, CLUSTERS};
use super::{MoveOptions, note, phase, read_record};
use crate::resources::move_window::{MoveRole, Strategy};
use crate::resources::phase::MovePhase;
use crate::window::close::{CloseOptions, Restored, close};
use crate::window::cluster::{Cluster, Result, read_window};
use crate::window::plan::move_plan::PAUSED_ANNOTATION;

/// Unpause what clusterctl paused: Clusters (`spec.paused`) and ClusterClasses (the paused
/// annotation), as a re-run needs them.
pub async fn unpause(
    c: &Cluster,
    clusters: &[String],
    classes: &[String],
    out: &mut Progress,
) -> Result<()> {
    unpause_saying(c, clusters, classes, "clusterctl paused it", out).await
}

/// `unpause`, saying why each was paused.
pub async fn unpause_saying(
    c: &Cluster,
    clusters: &[String],
    classes: &[String],
    why: &str,
    out: &mut Progress,
) -> Result<()> {
    for key in clusters {
        cluster_api::patch(
            c,
            CLUSTERS,
            key,
            json!({"spec": {"paused": false}}),
            "unpausing",
        )
        .await?;
        out.say(format!("{}: unpaused Cluster {key} ({why})", c.label));
    }
    for key in classes {
        cluster_api::patch(
            c,
            CLUSTER_CLASSES,
            key,
            json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}}),
            "unpausing",
        )
        .await?;
        out.say(format!("{}: unpaused ClusterClass {key} ({why})", c.label));
    }
    Ok(())
}

/// Close one cluster's window (one that has none is skipped: an `--abort` of a move that never
/// opened it), and record when its controllers were first released again: a re-run that
/// finds it restored keeps it. `wait_leading`: wait until a pod leads each released Lease.
pub async fn restore_one(
    c: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    wait_leading: bool,
    restored: &mut Vec<Restored>,
    out: &mut Progress,
) -> Result<()> {
    let p = phase(out, &format!("restoring the {}'s controllers", c.label));
    if read_window(c, &opts.window).await?.is_some() {
        let close_opts = CloseOptions {
            wait_leading,
            ..opts.close.clone()
        };
        restored.extend(close(std::slice::from_ref(c), &close_opts, out).await?);
    }
    let done = match wait_leading {
        true => format!("the {}'s controllers run again", c.label),
        false => format!(
            "the {}'s controllers are released: each leads at its candidates' next try",
            c.label
        ),
    };
    p.done(out, &done);
    let at = Timestamp::now().to_string();
    let role = c.role;
    note(target, &opts.window, |m| {
        let field = match role {
            Some(MoveRole::Source) => &mut m.source_back_at,
            _ => &mut m.target_back_at,
        };
        field.get_or_insert_with(|| at.clone());
    })
    .await
}

/// The move done: recorded, and how long each cluster's controllers were stopped.
pub async fn report_done(
    target: &Cluster,
    ns: &str,
    opts: &MoveOptions,
    started: Instant,
    restored: &[Restored],
    out: &mut Progress,
) -> Result<()> {
    note(target, &opts.window, |m| m.phase = MovePhase::Done).await?;
    let done = read_record(target, &opts.window).await?;
    out.say(format!(
        "handoff move: namespace {ns} moved in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    if let Some(m) = done {
        out.say(format!("  the target's controllers were stopped for {}, the source's for {} (from the first take-over to the last release, across re-runs)",
            stopped_for(m.target_stopped_at.as_deref(), m.target_back_at.as_deref()),
            stopped_for(m.source_stopped_at.as_deref(), m.source_back_at.as_deref())));
    }
    for r in restored {
        let how = match (&r.leader, r.strategy) {
            (Some(pod), _) => format!("Lease released, {pod} leads"),
            (None, Strategy::Lease) if r.note.is_none() => {
                "Lease released, a pod leads at its next try".into()
            }
            (None, Strategy::Lease) => "Lease released".into(),
            (None, _) => format!("restored to {} replicas", r.replicas),
        };
        out.say(format!(
            "  {}: {} ({:?}): {how}{}",
            r.cluster,
            r.deployment,
            r.strategy,
            r.note
                .as_ref()
                .map(|n| format!(" — {n}"))
                .unwrap_or_default()
        ));
    }
    Ok(())
}

fn stopped_for(from: Option<&str>, to: Option<&str>) -> String {
    let parse = |t: Option<&str>| t.and_then(|t| t.parse::<Timestamp>().ok());
    match (parse(from), parse(to)) {
        (Some(f), Some(t)) => format!("{:.1}s", t.duration_since(f).as_secs_f64()),
        _ => "no time (never stopped in this move)".into(),
    }
}

/// What an `--abort` brought back, and what clusterctl left behind for the user to decide.
pub fn report_abort(
    clusters: [&Cluster; 2],
    ns: &str,
    restored: &[Restored],
    paused: &[String],
    paused_classes: &[String],
    copied: &[String],
    out: &mut Progress,
) {
    out.say("handoff move --abort: every controller handoff stopped runs again");
    for c in clusters {
        let ds: Vec<String> = restored
            .iter()
            .filter(|r| r.cluster == c.label)
            .map(|r| format!("{} ({:?})", r.deployment, r.strategy))
            .collect();
        if !ds.is_empty() {
            out.say(format!("  {}: {}", c.label, ds.join(", ")));
        }
    }
    let list = |v: &[String]| match v.is_empty() {
        true => "none".to_string(),
        false => v.join(", "),
    };
    out.say("What clusterctl left behind, for you to decide:");
    out.say(format!("  source Clusters still paused: {}", list(paused)));
    if !paused_classes.is_empty() {
        out.say(format!(
            "  source ClusterClasses of namespace {ns} still paused: {} (unpause one: kubectl -n {ns} annotate clusterclasses.cluster.x-k8s.io NAME {PAUSED_ANNOTATION}-)",
            paused_classes.join(", ")
        ));
    }
    out.say(format!(
        "  Clusters in the target's namespace {ns}: {}",
        list(copied)
    ));
    if !paused.is_empty() {
        out.say(format!("  unpause one to let the source reconcile it again: kubectl -n {ns} patch clusters.cluster.x-k8s.io NAME --type merge -p '{{\"spec\":{{\"paused\":false}}}}'"));
    }
}
