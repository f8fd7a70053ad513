//! The way back in `handoff move`: each cluster's window closed in order, what clusterctl
//! paused unpaused, the closing report, and `--abort`.

use std::io::Write;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tokio::time::Instant;

use super::super::close::{Restored, close};
use super::super::common::{Cluster, Result, WindowError, read_window};
use super::super::move_plan::{self, BLOCK_MOVE, PAUSED_ANNOTATION, Start};
use super::cluster_api::{self, CLUSTER_CLASSES, CLUSTERS, clusters_in, paused_in};
use super::clusterctl::lift_block_move;
use super::{MoveOptions, note, phase, read_record, resumed};
use crate::resources::move_window::{MoveRecord, MoveRole, Strategy};
use crate::resources::phase::MovePhase;

/// Unpause what clusterctl paused: Clusters (`spec.paused`) and ClusterClasses (the paused
/// annotation), as a re-run needs them.
pub async fn unpause(
    c: &Cluster,
    clusters: &[String],
    classes: &[String],
    out: &mut dyn Write,
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
        let _ = writeln!(
            out,
            "{}: unpaused Cluster {key} (clusterctl paused it)",
            c.label
        );
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
        let _ = writeln!(
            out,
            "{}: unpaused ClusterClass {key} (clusterctl paused it)",
            c.label
        );
    }
    Ok(())
}

/// On a re-run: unpause the source's Clusters and ClusterClasses that clusterctl paused in the
/// recorded attempt (clusterctl refuses to start while any is paused), and forget them.
pub async fn unpause_what_clusterctl_paused(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    r: &MoveRecord,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = &r.namespace;
    let clusters = move_plan::to_unpause(
        &r.paused_by_clusterctl,
        &r.clusters,
        &clusters_in(source, ns).await?,
    );
    let classes = move_plan::to_unpause(
        &[],
        &r.cluster_classes,
        &paused_in(source, ns, CLUSTER_CLASSES).await?,
    );
    unpause(source, &clusters, &classes, out).await?;
    note(target, &opts.window, |m| m.paused_by_clusterctl.clear()).await
}

/// Close the target's window (its controllers lead again), then the source's, and record
/// when each was done.
pub async fn restore(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    restored: &mut Vec<Restored>,
    out: &mut dyn Write,
) -> Result<()> {
    restore_each([target, source], opts, restored, out).await?;
    Ok(())
}

/// Close the window on each cluster in the order given (one that has none is skipped); when
/// each cluster's controllers ran again.
pub async fn restore_each(
    order: [&Cluster; 2],
    opts: &MoveOptions,
    restored: &mut Vec<Restored>,
    out: &mut dyn Write,
) -> Result<[Timestamp; 2]> {
    let mut done = [Timestamp::now(); 2];
    for (i, c) in order.into_iter().enumerate() {
        let p = phase(out, &format!("restoring the {}'s controllers", c.label));
        if read_window(c, &opts.window).await?.is_some() {
            restored.extend(close(std::slice::from_ref(c), &opts.close, out).await?);
        }
        p.done(out, &format!("the {}'s controllers run again", c.label));
        done[i] = Timestamp::now();
        // When this cluster first ran again: a re-run that finds it restored keeps it.
        let at = done[i].to_string();
        let role = c.role;
        let target = order
            .iter()
            .find(|c| c.role == Some(MoveRole::Target))
            .unwrap_or(&order[0]);
        note(target, &opts.window, |m| {
            let field = match role {
                Some(MoveRole::Source) => &mut m.source_back_at,
                _ => &mut m.target_back_at,
            };
            field.get_or_insert_with(|| at.clone());
        })
        .await?;
    }
    Ok(done)
}

pub async fn finish(
    target: &Cluster,
    opts: &MoveOptions,
    started: Instant,
    restored: &[Restored],
    out: &mut dyn Write,
) -> Result<()> {
    note(target, &opts.window, |m| m.phase = MovePhase::Done).await?;
    let done = read_record(target, &opts.window).await?;
    let _ = writeln!(
        out,
        "handoff move: namespace {} moved in {:.1}s",
        opts.flags.namespace,
        started.elapsed().as_secs_f64()
    );
    if let Some(m) = done {
        let _ = writeln!(
            out,
            "  the target's controllers were stopped for {}, the source's for {} (from the first take-over to the last release, across re-runs)",
            stopped_for(m.target_stopped_at.as_deref(), m.target_back_at.as_deref()),
            stopped_for(m.source_stopped_at.as_deref(), m.source_back_at.as_deref()),
        );
    }
    for r in restored {
        let how = match (&r.leader, r.strategy) {
            (Some(pod), _) => format!("Lease released, {pod} leads"),
            (None, Strategy::Lease) => "Lease released".into(),
            (None, _) => format!("restored to {} replicas", r.replicas),
        };
        let _ = writeln!(
            out,
            "  {}: {} ({:?}): {how}{}",
            r.cluster,
            r.deployment,
            r.strategy,
            r.note
                .as_ref()
                .map(|n| format!(" — {n}"))
                .unwrap_or_default()
        );
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

/// `--abort`: every controller back as it was, the source's first (it still owns what was not
/// moved), handoff's block-move lifted, and what clusterctl left behind reported. It acts on
/// the recorded move's namespace, whatever `--namespace` says.
pub async fn abort(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    recorded: Option<&MoveRecord>,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = recorded
        .map(|r| r.namespace.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| opts.flags.namespace.clone());
    let _ = writeln!(
        out,
        "handoff move --abort: {}",
        match recorded {
            Some(r) => format!(
                "the move of namespace {} recorded in MoveWindow {} (phase {})",
                r.namespace, opts.window, r.phase
            ),
            None => format!(
                "no move recorded in MoveWindow {}; restoring whatever it stopped",
                opts.window
            ),
        }
    );
    if ns != opts.flags.namespace {
        let _ = writeln!(
            out,
            "note: aborting the recorded move of namespace {ns}, not --namespace {}",
            opts.flags.namespace
        );
    }
    if let Some(r) = recorded {
        let start = match move_plan::start(Some(r), &opts.window, &r.namespace) {
            Ok(Start::Resume) => resumed(source, target, r, out).await?,
            Ok(s) => s,
            Err(move_plan::StartError::UnknownPhase(e)) => {
                return Err(WindowError::Refused {
                    cluster: target.label.clone(),
                    message: e.to_string(),
                });
            }
            // An --abort that did not finish: this one finishes it.
            Err(_) => Start::Resume,
        };
        if let Some(why) = move_plan::abort_refused(&start, &ns) {
            return Err(WindowError::Refused {
                cluster: target.label.clone(),
                message: why,
            });
        }
        note(target, &opts.window, |m| m.phase = MovePhase::Aborting).await?;
    }
    let lifted = lift_block_move(source, target, &opts.window, &ns).await?;
    if !lifted.is_empty() {
        let _ = writeln!(
            out,
            "source: lifted handoff's {BLOCK_MOVE} from {}",
            lifted.join(", ")
        );
    }
    let mut restored = Vec::new();
    restore_each([source, target], opts, &mut restored, out).await?;
    if recorded.is_some() {
        note(target, &opts.window, |m| m.phase = MovePhase::Aborted).await?;
    }
    let paused: Vec<String> = clusters_in(source, &ns)
        .await?
        .into_iter()
        .filter(|c| c.paused)
        .map(|c| c.key)
        .collect();
    let copied: Vec<String> = clusters_in(target, &ns)
        .await?
        .into_iter()
        .map(|c| c.key)
        .collect();
    let _ = writeln!(
        out,
        "handoff move --abort: every controller handoff stopped runs again"
    );
    for c in [source, target] {
        let ds: Vec<String> = restored
            .iter()
            .filter(|r| r.cluster == c.label)
            .map(|r| format!("{} ({:?})", r.deployment, r.strategy))
            .collect();
        if !ds.is_empty() {
            let _ = writeln!(out, "  {}: {}", c.label, ds.join(", "));
        }
    }
    let list = |v: &[String]| match v.is_empty() {
        true => "none".to_string(),
        false => v.join(", "),
    };
    let _ = writeln!(out, "What clusterctl left behind, for you to decide:");
    let _ = writeln!(out, "  source Clusters still paused: {}", list(&paused));
    let _ = writeln!(
        out,
        "  Clusters in the target's namespace {ns}: {}",
        list(&copied)
    );
    if !paused.is_empty() {
        let _ = writeln!(
            out,
            "  unpause one to let the source reconcile it again: kubectl -n {ns} patch clusters.cluster.x-k8s.io NAME --type merge -p '{{\"spec\":{{\"paused\":false}}}}'"
        );
    }
    Ok(())
}
