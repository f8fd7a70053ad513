//! `handoff move`: `clusterctl move` as a child process, with both clusters' controllers
//! stopped around it in the order clusterctl needs, and a way back. What to do comes from
//! `move_plan`; the windows come from `open` and `close`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::close::{CloseOptions, Restored, close};
use super::common::{Cluster, Result, WindowError, api_err, now, record};
use super::move_plan::{self, BLOCK_MOVE, ClusterSeen, ClusterctlFlags, PAUSED_ANNOTATION, Start};
use super::open::{OpenOptions, check, open, plan_open};
use crate::resources::move_window::{MoveRecord, MoveWindow, WindowState};

#[derive(Debug, Clone)]
pub struct MoveOptions {
    pub window: String,
    pub flags: ClusterctlFlags,
    pub clusterctl: PathBuf,
    pub abort: bool,
    /// How each cluster's window is opened (its name is `window`).
    pub open: OpenOptions,
    pub close: CloseOptions,
    /// How often the source is read while clusterctl waits.
    pub poll: Duration,
}

/// `CLUSTERS_CRD`'s served version, plural and kind, as a dynamic resource.
const CLUSTERS_CRD: &str = "clusters.cluster.x-k8s.io";

fn api_resource(crd: &CustomResourceDefinition) -> Option<ApiResource> {
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage && v.served)
        .or_else(|| crd.spec.versions.iter().find(|v| v.served))?;
    Some(ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    })
}

async fn clusters_resource(c: &Cluster) -> Result<Option<ApiResource>> {
    Ok(Api::<CustomResourceDefinition>::all(c.client.clone())
        .get_opt(CLUSTERS_CRD)
        .await
        .map_err(api_err(
            c,
            format!("reading CustomResourceDefinition {CLUSTERS_CRD}"),
        ))?
        .as_ref()
        .and_then(api_resource))
}

/// The Clusters clusterctl moves: every Cluster in the namespace.
async fn clusters_in(c: &Cluster, ns: &str) -> Result<Vec<ClusterSeen>> {
    let Some(ar) = clusters_resource(c).await? else {
        return Ok(vec![]);
    };
    let list = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, format!("listing Clusters in {ns}")))?;
    let mut out: Vec<ClusterSeen> = list
        .items
        .iter()
        .map(|o| {
            let ann = o.metadata.annotations.as_ref();
            ClusterSeen {
                key: format!("{ns}/{}", o.metadata.name.clone().unwrap_or_default()),
                paused: o.data["spec"]["paused"].as_bool() == Some(true)
                    || ann.is_some_and(|a| a.contains_key(PAUSED_ANNOTATION)),
                block_move: ann.and_then(|a| a.get(BLOCK_MOVE)).cloned(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Every other object in scope that carries a block-move: instances, in the namespace, of the
/// CRDs clusterctl moves (labelled `clusterctl.cluster.x-k8s.io`, as its discovery selects
/// them: `objectgraph.go`, `getDiscoveryTypes`).
async fn blocking_objects(c: &Cluster, ns: &str) -> Result<Vec<String>> {
    let crds = Api::<CustomResourceDefinition>::all(c.client.clone())
        .list(&ListParams::default().labels("clusterctl.cluster.x-k8s.io"))
        .await
        .map_err(api_err(
            c,
            "listing the CustomResourceDefinitions clusterctl moves",
        ))?;
    let mut out = Vec::new();
    for crd in crds.items {
        if crd.spec.scope != "Namespaced" || crd.metadata.name.as_deref() == Some(CLUSTERS_CRD) {
            continue;
        }
        let Some(ar) = api_resource(&crd) else {
            continue;
        };
        let list = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
            .list_metadata(&ListParams::default())
            .await
            .map_err(api_err(c, format!("listing {} in {ns}", ar.plural)))?;
        for o in list.items {
            if o.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(BLOCK_MOVE))
            {
                out.push(format!(
                    "{} {ns}/{}",
                    ar.kind,
                    o.metadata.name.unwrap_or_default()
                ));
            }
        }
    }
    out.sort();
    Ok(out)
}

async fn patch_cluster(
    c: &Cluster,
    key: &str,
    patch: serde_json::Value,
    what: &str,
) -> Result<bool> {
    let Some(ar) = clusters_resource(c).await? else {
        return Ok(false);
    };
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let api = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar);
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(api_err(c, format!("{what} Cluster {key}"))(e)),
    }
}

async fn read_record(c: &Cluster, window: &str) -> Result<Option<MoveRecord>> {
    Ok(Api::<MoveWindow>::all(c.client.clone())
        .get_opt(window)
        .await
        .map_err(api_err(c, format!("reading MoveWindow {window}")))?
        .and_then(|w| w.status)
        .and_then(|s| s.move_record))
}

async fn note(c: &Cluster, window: &str, f: impl Fn(&mut MoveRecord)) -> Result<()> {
    record(c, window, |s| {
        f(s.move_record.get_or_insert_with(MoveRecord::default))
    })
    .await?;
    Ok(())
}

async fn window_open(c: &Cluster, window: &str) -> Result<bool> {
    Ok(Api::<MoveWindow>::all(c.client.clone())
        .get_opt(window)
        .await
        .map_err(api_err(c, format!("reading MoveWindow {window}")))?
        .is_some_and(|w| w.spec.state == WindowState::Open))
}

/// A phase: its name on a line, its duration when it ends.
struct Phase {
    started: Instant,
}

fn phase(out: &mut dyn Write, what: &str) -> Phase {
    let _ = writeln!(out, "handoff move: {what}");
    Phase {
        started: Instant::now(),
    }
}

impl Phase {
    fn done(self, out: &mut dyn Write, what: &str) -> Duration {
        let took = self.started.elapsed();
        let _ = writeln!(out, "handoff move: {what} ({:.1}s)", took.as_secs_f64());
        took
    }
}

/// Remove handoff's block-move from every Cluster of the namespace that carries it (and only
/// handoff's): it must never be copied to the target or hold the next move.
async fn lift_block_move(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
) -> Result<Vec<String>> {
    let ours = move_plan::block_move_value(&opts.window);
    let mut lifted = Vec::new();
    for cl in clusters_in(source, &opts.flags.namespace).await? {
        if cl.block_move.as_deref() == Some(&ours)
            && patch_cluster(
                source,
                &cl.key,
                json!({"metadata": {"annotations": {BLOCK_MOVE: null}}}),
                "removing handoff's block-move from",
            )
            .await?
        {
            lifted.push(cl.key);
        }
    }
    note(target, &opts.window, |m| m.block_move.clear()).await?;
    Ok(lifted)
}

/// Run the whole move, or resume it, or abort it.
pub async fn run(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    out: &mut dyn Write,
) -> Result<()> {
    let started = Instant::now();
    let ns = opts.flags.namespace.clone();
    if opts.flags.dry_run {
        return dry_run(source, target, opts, out).await;
    }
    let recorded = read_record(target, &opts.window).await?;
    if opts.abort {
        return abort(source, target, opts, recorded.as_ref(), out).await;
    }
    let start =
        move_plan::start(recorded.as_ref(), &ns).map_err(|message| WindowError::Refused {
            cluster: target.label.clone(),
            message,
        })?;
    let mut restored = Vec::new();
    if start == Start::RestoreOnly {
        let _ = writeln!(
            out,
            "handoff move: clusterctl already moved namespace {ns}; restoring the controllers"
        );
        restore(source, target, opts, &mut restored, out).await?;
        return finish(target, opts, started, &restored, None, out).await;
    }

    // Before anything is written: both clusters' stops must be possible.
    let p = phase(
        out,
        "checking how each controller would be stopped, in both clusters",
    );
    let mut target_opts = opts.open.clone();
    target_opts
        .reason
        .get_or_insert_with(|| format!("handoff move of namespace {ns}: target"));
    check(std::slice::from_ref(target), &target_opts, out).await?;
    check(std::slice::from_ref(source), &opts.open, out).await?;
    p.done(out, "checked");

    if start == Start::Resume {
        let r = recorded.clone().unwrap_or_default();
        let p = phase(
            out,
            &format!(
                "resuming the move recorded in MoveWindow {} on the target (phase {}, attempt {}): putting the source back as clusterctl expects it",
                opts.window, r.phase, r.attempts
            ),
        );
        // Providers lift their block-move only while their controllers run.
        if window_open(source, &opts.window).await? {
            close(std::slice::from_ref(source), &opts.close, out).await?;
        }
        let clusters = clusters_in(source, &ns).await?;
        for key in move_plan::to_unpause(&r, &clusters) {
            patch_cluster(
                source,
                &key,
                json!({"spec": {"paused": false}}),
                "unpausing",
            )
            .await?;
            let _ = writeln!(out, "source: unpaused Cluster {key} (clusterctl paused it)");
        }
        note(target, &opts.window, |m| m.paused_by_clusterctl.clear()).await?;
        p.done(out, "the source runs again, the target stays stopped");
    }
    let clusters = clusters_in(source, &ns).await?;
    let refused = move_plan::refuses(&clusters, &[]);
    if !refused.is_empty() {
        return Err(WindowError::Refused {
            cluster: source.label.clone(),
            message: format!(
                "these Clusters are paused, and clusterctl move refuses to start while any is (since v1.12): {}; unpause them (kubectl -n {ns} patch cluster NAME --type merge -p '{{\"spec\":{{\"paused\":false}}}}') or move without them",
                refused.join(", ")
            ),
        });
    }

    // 1. The target's controllers, before anything is copied.
    let p = phase(out, "stopping the target's controllers");
    open(std::slice::from_ref(target), &target_opts, out).await?;
    let target_stopped = Instant::now();
    note(target, &opts.window, |m| {
        let attempts = m.attempts;
        *m = MoveRecord {
            phase: "Stopping target".into(),
            namespace: ns.clone(),
            started_at: Some(now()),
            attempts: attempts + 1,
            ..MoveRecord::default()
        };
    })
    .await?;
    p.done(out, "the target's controllers are stopped");

    // 2. handoff's block-move on each source Cluster, so that clusterctl's wait includes
    // handoff's: recorded before written, so a run that dies after the write still lifts it.
    let add = move_plan::add_block_move(&clusters, &opts.window);
    let unpaused: Vec<String> = clusters
        .iter()
        .filter(|c| !c.paused)
        .map(|c| c.key.clone())
        .collect();
    note(target, &opts.window, |m| {
        m.phase = "Moving".into();
        m.clusters = unpaused.clone();
        m.block_move = add.clone();
    })
    .await?;
    for key in &add {
        patch_cluster(
            source,
            key,
            json!({"metadata": {"annotations": {BLOCK_MOVE: move_plan::block_move_value(&opts.window)}}}),
            "putting handoff's block-move on",
        )
        .await?;
    }
    if !add.is_empty() {
        let _ = writeln!(
            out,
            "source: {BLOCK_MOVE} on Cluster {} until the source's controllers are stopped",
            add.join(", ")
        );
    }

    // 3. clusterctl, while the source's controllers still run.
    let p = phase(
        out,
        &format!(
            "running {} {}",
            opts.clusterctl.display(),
            render_args(&opts.flags)
        ),
    );
    let outcome = run_clusterctl(source, target, opts, &unpaused, out).await;
    let (status, source_stopped) = match outcome {
        Ok(v) => v,
        Err(e) => {
            // handoff itself failed while clusterctl ran (clusterctl was stopped first).
            let _ = lift_block_move(source, target, opts).await;
            return Err(e);
        }
    };
    let code = status.code;
    p.done(out, &format!("clusterctl exited {}", status.describe()));
    // Never leave handoff's block-move behind, whatever clusterctl did.
    let lifted = lift_block_move(source, target, opts).await?;
    if code != Some(0) {
        note(target, &opts.window, |m| {
            m.phase = "Failed".into();
            m.clusterctl_exit = Some(code.unwrap_or(-1));
            m.error = Some(format!("clusterctl move exited {}", status.describe()));
        })
        .await?;
        let what = format!(
            "clusterctl move exited {}{}",
            status.describe(),
            if status.interrupted {
                " (handoff was interrupted and passed the signal on)"
            } else {
                ""
            }
        );
        return Err(WindowError::Clusterctl {
            code: code.filter(|c| *c > 0).unwrap_or(1),
            help: move_plan::failure_help(&opts.flags, &opts.window, &opts.clusterctl, &what),
        });
    }
    if source_stopped.is_none() && !lifted.is_empty() {
        let _ = writeln!(
            out,
            "warning: clusterctl finished without waiting for handoff's block-move on {}: the source's controllers were not stopped during the copy",
            lifted.join(", ")
        );
    }
    note(target, &opts.window, |m| {
        m.phase = "Restoring".into();
        m.clusterctl_exit = Some(0);
        m.error = None;
    })
    .await?;
    // 4. Back: the target's first, then the source's.
    let (target_back, source_back) = restore(source, target, opts, &mut restored, out).await?;
    let durations = Some((
        target_back.duration_since(target_stopped),
        source_stopped.map(|s| source_back.duration_since(s)),
    ));
    finish(target, opts, started, &restored, durations, out).await
}

/// Close the target's window (its controllers lead again), then the source's. Returns when
/// each was done.
async fn restore(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    restored: &mut Vec<Restored>,
    out: &mut dyn Write,
) -> Result<(Instant, Instant)> {
    let p = phase(out, "restoring the target's controllers");
    if window_open(target, &opts.window).await?
        || read_record(target, &opts.window).await?.is_some()
    {
        restored.extend(close(std::slice::from_ref(target), &opts.close, out).await?);
    }
    p.done(out, "the target's controllers run again");
    let target_done = Instant::now();
    let p = phase(out, "restoring the source's controllers");
    if Api::<MoveWindow>::all(source.client.clone())
        .get_opt(&opts.window)
        .await
        .map_err(api_err(
            source,
            format!("reading MoveWindow {}", opts.window),
        ))?
        .is_some()
    {
        restored.extend(close(std::slice::from_ref(source), &opts.close, out).await?);
    }
    p.done(out, "the source's controllers run again");
    Ok((target_done, Instant::now()))
}

async fn finish(
    target: &Cluster,
    opts: &MoveOptions,
    started: Instant,
    restored: &[Restored],
    stopped: Option<(Duration, Option<Duration>)>,
    out: &mut dyn Write,
) -> Result<()> {
    note(target, &opts.window, |m| m.phase = "Done".into()).await?;
    let _ = writeln!(
        out,
        "handoff move: namespace {} moved in {:.1}s",
        opts.flags.namespace,
        started.elapsed().as_secs_f64()
    );
    if let Some((t, s)) = stopped {
        let _ = writeln!(
            out,
            "  the target's controllers were stopped for {:.1}s, the source's for {}",
            t.as_secs_f64(),
            s.map(|s| format!("{:.1}s", s.as_secs_f64()))
                .unwrap_or_else(|| "no time (clusterctl did not wait)".into())
        );
    }
    for r in restored {
        let how = match (&r.leader, r.strategy) {
            (Some(pod), _) => format!("Lease released, {pod} leads"),
            (None, crate::resources::move_window::Strategy::Lease) => "Lease released".into(),
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

fn render_args(f: &ClusterctlFlags) -> String {
    move_plan::clusterctl_args(f)
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

struct ExitStatus {
    code: Option<i32>,
    signal: Option<i32>,
    interrupted: bool,
}

impl ExitStatus {
    fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("with exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "without an exit code".into(),
        }
    }
}

/// Run clusterctl to its end. Meanwhile: once clusterctl has paused the source and the
/// providers have lifted their block-move, stop the source's controllers (proven), then lift
/// handoff's block-move so that clusterctl copies. SIGINT and SIGTERM go to clusterctl first.
/// Returns how clusterctl ended and when the source was stopped.
async fn run_clusterctl(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    unpaused_at_start: &[String],
    out: &mut dyn Write,
) -> Result<(ExitStatus, Option<Instant>)> {
    use std::os::unix::process::ExitStatusExt as _;
    use tokio::signal::unix::{SignalKind, signal};
    let mut cmd = tokio::process::Command::new(&opts.clusterctl);
    cmd.args(move_plan::clusterctl_args(&opts.flags))
        .stdin(std::process::Stdio::null())
        // Its own process group: a Ctrl-C in the terminal reaches handoff, which passes it on
        // once, instead of reaching both.
        .process_group(0)
        .kill_on_drop(false);
    // And it dies with handoff (SIGTERM when handoff's spawning thread ends, a kill -9
    // included): a clusterctl left running would copy behind a re-run's back.
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| WindowError::Refused {
        cluster: source.label.clone(),
        message: format!(
            "cannot run {}: {e} (--clusterctl names the binary; the default is clusterctl on PATH)",
            opts.clusterctl.display()
        ),
    })?;
    let pid = child.id().map(|p| p as i32);
    let forward = |sig: i32| {
        if let Some(pid) = pid {
            // SAFETY: kill(2) on our own child's pid, with a plain signal number.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    };
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| WindowError::Refused {
        cluster: source.label.clone(),
        message: format!("cannot handle SIGINT: {e}"),
    })?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| WindowError::Refused {
        cluster: source.label.clone(),
        message: format!("cannot handle SIGTERM: {e}"),
    })?;
    let mut interrupted = false;
    let mut source_stopped: Option<Instant> = None;
    let mut last_wait = String::new();
    let mut tick = tokio::time::interval(opts.poll);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = sigint.recv() => {
                let _ = writeln!(out, "handoff move: interrupted; passing SIGINT to clusterctl and waiting for it to stop");
                interrupted = true;
                forward(libc::SIGINT);
            }
            _ = sigterm.recv() => {
                let _ = writeln!(out, "handoff move: terminated; passing SIGTERM to clusterctl and waiting for it to stop");
                interrupted = true;
                forward(libc::SIGTERM);
            }
            _ = tick.tick(), if source_stopped.is_none() && !interrupted => {
                let step = async {
                    let clusters = clusters_in(source, &opts.flags.namespace).await?;
                    let blocking = blocking_objects(source, &opts.flags.namespace).await?;
                    Ok::<_, WindowError>((clusters, blocking))
                };
                let (clusters, blocking) = match step.await {
                    Ok(v) => v,
                    // A read that fails is retried at the next tick; clusterctl keeps waiting.
                    Err(e) => {
                        let _ = writeln!(out, "warning: {e}; trying again");
                        continue;
                    }
                };
                match move_plan::source_ready(&clusters, &blocking, &opts.window) {
                    Err(waiting) => {
                        if waiting != last_wait {
                            let _ = writeln!(out, "handoff move: waiting for {waiting}");
                            last_wait = waiting;
                        }
                    }
                    Ok(()) => {
                        let paused: Vec<String> = clusters
                            .iter()
                            .filter(|c| c.paused && unpaused_at_start.contains(&c.key))
                            .map(|c| c.key.clone())
                            .collect();
                        let stop = async {
                            note(target, &opts.window, |m| {
                                m.phase = "Stopping source".into();
                                m.paused_by_clusterctl = paused.clone();
                            })
                            .await?;
                            let p = phase(out, "clusterctl paused the source and the providers lifted their block-move: stopping the source's controllers");
                            let mut source_opts = opts.open.clone();
                            source_opts.reason.get_or_insert_with(|| format!("handoff move of namespace {}: source", opts.flags.namespace));
                            open(std::slice::from_ref(source), &source_opts, out).await?;
                            p.done(out, "the source's controllers are stopped");
                            let lifted = lift_block_move(source, target, opts).await?;
                            if !lifted.is_empty() {
                                let _ = writeln!(out, "source: lifted handoff's {BLOCK_MOVE} from {}: clusterctl copies now", lifted.join(", "));
                            }
                            note(target, &opts.window, |m| m.phase = "Copying".into()).await
                        };
                        match stop.await {
                            Ok(()) => source_stopped = Some(Instant::now()),
                            Err(e) => {
                                // The source could not be stopped: clusterctl must not copy
                                // with its controllers running. Stop clusterctl first.
                                let _ = writeln!(out, "handoff move: {e}; stopping clusterctl before it copies anything");
                                forward(libc::SIGTERM);
                                let _ = child.wait().await;
                                return Err(e);
                            }
                        }
                    }
                }
            }
        }
    };
    let status = status.map_err(|e| WindowError::Refused {
        cluster: source.label.clone(),
        message: format!("waiting for clusterctl: {e}"),
    })?;
    Ok((
        ExitStatus {
            code: status.code(),
            signal: status.signal(),
            interrupted,
        },
        source_stopped,
    ))
}

/// `--dry-run`: clusterctl's own dry run, and handoff's plan for both clusters; nothing is
/// written.
async fn dry_run(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = &opts.flags.namespace;
    let _ = writeln!(
        out,
        "handoff move --dry-run: what handoff would do around clusterctl move (nothing is written)"
    );
    let _ = writeln!(out, "1. stop the target's controllers:");
    plan_open(std::slice::from_ref(target), &opts.open, out).await?;
    let clusters = clusters_in(source, ns).await?;
    let add = move_plan::add_block_move(&clusters, &opts.window);
    let _ = writeln!(
        out,
        "2. put {BLOCK_MOVE} on Cluster {} in the source, and run clusterctl move",
        if add.is_empty() {
            "(none)".to_string()
        } else {
            add.join(", ")
        }
    );
    let refused = move_plan::refuses(&clusters, &[]);
    if !refused.is_empty() {
        let _ = writeln!(
            out,
            "   would refuse: Clusters paused already ({})",
            refused.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "3. once clusterctl has paused them and the providers lifted their block-move, stop the source's controllers:"
    );
    plan_open(std::slice::from_ref(source), &opts.open, out).await?;
    let _ = writeln!(
        out,
        "4. after clusterctl succeeds: restore the target's controllers, then the source's"
    );
    let _ = writeln!(
        out,
        "handoff move --dry-run: running {} {}",
        opts.clusterctl.display(),
        render_args(&opts.flags)
    );
    let status = tokio::process::Command::new(&opts.clusterctl)
        .args(move_plan::clusterctl_args(&opts.flags))
        .stdin(std::process::Stdio::null())
        .status()
        .await
        .map_err(|e| WindowError::Refused {
            cluster: source.label.clone(),
            message: format!("cannot run {}: {e}", opts.clusterctl.display()),
        })?;
    match status.code() {
        Some(0) => Ok(()),
        code => Err(WindowError::Clusterctl {
            code: code.filter(|c| *c > 0).unwrap_or(1),
            help: format!("clusterctl move --dry-run exited {status}"),
        }),
    }
}

/// `--abort`: every controller back as it was, the source's first (it still owns what was not
/// moved), handoff's block-move lifted, and what clusterctl left behind reported.
async fn abort(
    source: &Cluster,
    target: &Cluster,
    opts: &MoveOptions,
    recorded: Option<&MoveRecord>,
    out: &mut dyn Write,
) -> Result<()> {
    let ns = &opts.flags.namespace;
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
    if recorded.is_some() {
        note(target, &opts.window, |m| m.phase = "Aborting".into()).await?;
    }
    let lifted = lift_block_move(source, target, opts).await;
    if let Ok(l) = &lifted
        && !l.is_empty()
    {
        let _ = writeln!(
            out,
            "source: lifted handoff's {BLOCK_MOVE} from {}",
            l.join(", ")
        );
    }
    let mut restored = Vec::new();
    for c in [source, target] {
        let p = phase(out, &format!("restoring the {}'s controllers", c.label));
        let exists = Api::<MoveWindow>::all(c.client.clone())
            .get_opt(&opts.window)
            .await
            .map_err(api_err(c, format!("reading MoveWindow {}", opts.window)))?
            .is_some();
        if exists {
            restored.extend(close(std::slice::from_ref(c), &opts.close, out).await?);
        }
        p.done(out, &format!("the {}'s controllers run again", c.label));
    }
    if recorded.is_some() {
        note(target, &opts.window, |m| m.phase = "Aborted".into()).await?;
    }
    let paused: Vec<String> = clusters_in(source, ns)
        .await?
        .into_iter()
        .filter(|c| c.paused)
        .map(|c| c.key)
        .collect();
    let copied: Vec<String> = clusters_in(target, ns)
        .await?
        .into_iter()
        .map(|c| c.key)
        .collect();
    let _ = writeln!(
        out,
        "handoff move --abort: every controller handoff stopped runs again"
    );
    let mut by_cluster: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in &restored {
        by_cluster
            .entry(&r.cluster)
            .or_default()
            .push(format!("{} ({:?})", r.deployment, r.strategy));
    }
    for (c, ds) in by_cluster {
        let _ = writeln!(out, "  {c}: {}", ds.join(", "));
    }
    let _ = writeln!(out, "What clusterctl left behind, for you to decide:");
    let _ = writeln!(
        out,
        "  source Clusters still paused: {}",
        if paused.is_empty() {
            "none".into()
        } else {
            paused.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "  Clusters in the target's namespace {ns}: {}",
        if copied.is_empty() {
            "none".into()
        } else {
            copied.join(", ")
        }
    );
    if !paused.is_empty() {
        let _ = writeln!(
            out,
            "  unpause one to let the source reconcile it again: kubectl -n {ns} patch clusters.cluster.x-k8s.io NAME --type merge -p '{{\"spec\":{{\"paused\":false}}}}'"
        );
    }
    lifted.map(|_| ())
}
