//! `handoff move --all-namespaces`: every namespace of the source moved under one stop of
//! both clusters, clusterctl once per namespace (`plan::all_next` decides; this file reads,
//! writes and runs). The record is the target's window's, as a move of one namespace keeps
//! it, with each namespace's state.

use serde_json::json;
use tokio::time::Instant;

use super::MoveOptions;
use super::cluster_api::{
    CLUSTER_CLASSES, CLUSTERS, clusters_in, every_class, every_cluster, move_hierarchy_roots,
    patch, scan,
};
use super::restore::unpause_saying;
use crate::resources::move_window::{MoveRecord, MoveRole, NamespaceMove};
use crate::resources::phase::MovePhase;
use crate::window::close::{CloseOptions, close, say_removed};
use crate::window::cluster::{Cluster, Result, WindowError, now, read_window, record};
use crate::window::open::{OpenOptions, check, open, window_at_least_closed};
use crate::window::plan::all_namespaces;
use crate::window::plan::all_next::{
    Ended, Failure, Found, WholeAsked, WholePlanner, WholeReached, WholeRecord, WholeSeen,
    WholeStep,
};
use crate::window::plan::directory_plan;
use crate::window::plan::move_next::Seen;
use crate::window::plan::move_plan::{ClusterctlFlags, PAUSED_ANNOTATION, Paused, clusterctl_args};
use crate::window::progress::Progress;
use crate::window::runner::{self, Performer, Publish};

/// Every namespace of `c` that holds something clusterctl moves, by name (a whole backup's;
/// a backup deletes nothing, so it needs no order).
pub async fn namespaces(c: &Cluster) -> Result<Vec<String>> {
    let clusters = every_cluster(c).await?;
    let classes = every_class(c).await?;
    let roots = move_hierarchy_roots(c).await?;
    Ok(all_namespaces::namespaces(&clusters, &classes, &roots)
        .into_iter()
        .map(|n| n.name)
        .collect())
}

/// A whole move from start to end, its resumption, or its `--abort`.
pub async fn run(
    source: &Cluster,
    target: &Cluster,
    o: &MoveOptions,
    out: &mut Progress,
) -> Result<()> {
    if o.flags.dry_run {
        return super::whole_dry_run::dry_run(source, o, out).await;
    }
    let rec = super::read_record(target, &o.window).await?;
    let record = match rec {
        Some(r) if !r.phase.is_over() && r.namespaces.is_empty() => {
            return Err(WindowError::Refused {
                cluster: target.label.into(),
                message: format!(
                    "MoveWindow {} records a move of namespace {} (phase {}): finish it with `handoff move -n {}` (or --abort), or give this move another --window",
                    o.window, r.namespace, r.phase, r.namespace
                ),
            });
        }
        Some(r) => {
            if !r.phase.is_over() {
                out.say(format!(
                    "handoff move -A: MoveWindow {} records a whole move that did not finish (phase {}, attempt {}); {}",
                    o.window,
                    r.phase,
                    r.attempts,
                    match o.abort {
                        true => "putting back what it can",
                        false => "going on from where it stopped",
                    }
                ));
            }
            Some(whole_record(&r))
        }
        None => None,
    };
    let planner = WholePlanner {
        asked: WholeAsked {
            window: o.window.clone(),
            abort: o.abort,
        },
        record,
    };
    let mut x = WholeRun {
        source,
        target,
        o,
        quiet: OpenOptions {
            quiet_preflight: true,
            ..o.open.clone()
        },
        started: Instant::now(),
        out,
    };
    let reached = runner::run(&planner, &mut x, Publish::Top(&o.step_label)).await?;
    ended(source, reached)
}

/// How the run ends for the user: the planner's refusal, clusterctl's code, or the error that
/// made a run that had paused the source put it back.
fn ended(source: &Cluster, reached: WholeReached) -> Result<()> {
    if let Some(why) = reached.failed_before_stop {
        return Err(WindowError::Failed(format!(
            "handoff move -A stopped before it stopped any controller: {why}; what it paused is unpaused again and the move recorded undone. Run the same command again"
        )));
    }
    match reached.ended {
        Ended::Refused(why) => Err(WindowError::WholeRefused {
            cluster: source.label,
            why,
        }),
        Ended::Failed(Failure {
            what,
            exit: Some(code),
            ..
        }) => Err(WindowError::Clusterctl { code, help: what }),
        Ended::Failed(Failure { what, .. }) => Err(WindowError::Failed(what)),
        Ended::Done | Ended::Aborted | Ended::No => Ok(()),
    }
}

fn whole_record(r: &MoveRecord) -> WholeRecord {
    WholeRecord {
        phase: r.phase.clone(),
        namespaces: r
            .namespaces
            .iter()
            .map(|n| (n.name.clone(), n.state))
            .collect(),
        paused: Paused {
            clusters: r.clusters.clone(),
            classes: r.cluster_classes.clone(),
        },
    }
}

struct WholeRun<'a, 'o> {
    source: &'a Cluster,
    target: &'a Cluster,
    o: &'a MoveOptions,
    quiet: OpenOptions,
    started: Instant,
    out: &'o mut Progress,
}

impl Performer<WholePlanner> for WholeRun<'_, '_> {
    type Error = WindowError;

    async fn read(&mut self, p: &WholePlanner, r: &WholeReached) -> Result<WholeSeen> {
        let reads = p.reads(r);
        let source = self.source;
        let mut seen = WholeSeen::default();
        if reads.clusters || reads.order {
            let clusters = every_cluster(source).await?;
            let classes = every_class(source).await?;
            if reads.order {
                let roots = move_hierarchy_roots(source).await?;
                let ns = all_namespaces::namespaces(&clusters, &classes, &roots);
                seen.order = Seen::Read(all_namespaces::order(&ns, &clusters));
            }
            seen.clusters = Seen::Read(clusters);
            seen.classes = Seen::Read(classes);
        }
        if reads.deleting {
            let rec = p.record.as_ref().expect("a recorded move to abort");
            let ns = rec.in_flight().unwrap_or_default();
            let mut roots = rec.paused.clusters.clone();
            roots.extend(rec.paused.classes.iter().cloned());
            seen.deleting = Seen::Read(self.deleting(ns, &roots).await?);
        }
        if reads.target {
            seen.target_clusters = Seen::Read(every_cluster(self.target).await?);
            seen.target_classes = Seen::Read(every_class(self.target).await?);
        }
        if reads.version {
            let said = crate::window::child::version(&self.o.clusterctl)
                .await
                .map_err(|e| WindowError::Refused {
                    cluster: source.label.into(),
                    message: e.to_string(),
                })?;
            seen.version = Seen::Read(said);
        }
        Ok(seen)
    }

    async fn perform(&mut self, step: &WholeStep, _: &WholeSeen) -> Result<Found> {
        let (source, target) = (self.source, self.target);
        match step {
            WholeStep::Check { warn } => {
                if let Some(w) = warn {
                    self.out.say(format!("handoff move -A: {w}"));
                }
                check(&[target.clone(), source.clone()], &self.o.open, self.out).await?
            }
            WholeStep::Record { namespaces, paused } => self.record(namespaces, paused).await?,
            WholeStep::Pause(p) => self.pause(p).await?,
            WholeStep::WaitUnblocked => self.wait_unblocked().await?,
            WholeStep::Stop => self.stop().await?,
            WholeStep::Unpause(p) => {
                let why = "handoff paused it; nothing reconciles it now, and clusterctl refuses a paused Cluster";
                unpause_saying(source, &p.clusters, &p.classes, why, self.out).await?
            }
            WholeStep::Clusterctl { namespace } => return self.clusterctl(namespace).await,
            WholeStep::Moved {
                namespace,
                unpause_classes,
                unpause_target,
            } => {
                self.moved(namespace, unpause_classes, unpause_target)
                    .await?
            }
            WholeStep::Fail(f) => self.fail(f).await?,
            WholeStep::Copied => self.note(|m| m.phase = MovePhase::Restoring).await?,
            WholeStep::RestoreTarget => self.restore(target, false).await?,
            WholeStep::RestoreSource { wait_leading } => {
                self.restore(source, *wait_leading).await?
            }
            WholeStep::PutBack(p) => {
                unpause_saying(
                    source,
                    &p.clusters,
                    &p.classes,
                    "handoff paused it",
                    self.out,
                )
                .await?
            }
            WholeStep::BeginAbort => self.note(|m| m.phase = MovePhase::Aborting).await?,
            WholeStep::Finish => self.finish().await?,
            WholeStep::Aborted {
                moved,
                in_flight,
                recorded,
            } => self.aborted(moved, in_flight.as_deref(), *recorded).await?,
            WholeStep::Refuse(_) => {}
            WholeStep::Uninstall => {
                say_removed(target, &self.o.window, self.out).await?;
                say_removed(source, &self.o.window, self.out).await?;
            }
            WholeStep::Done => {}
        }
        Ok(Found::Nothing)
    }

    fn progress(&mut self) -> &mut Progress {
        self.out
    }
}

impl WholeRun<'_, '_> {
    fn closing(&self, wait_leading: bool) -> CloseOptions {
        CloseOptions {
            uninstall: false,
            wait_leading,
            ..self.o.close.clone()
        }
    }

    /// Change the target's record, where there is one (an `--abort` may find none): the move's
    /// own `note`, one read-modify-write.
    async fn note(&self, f: impl Fn(&mut MoveRecord)) -> Result<()> {
        super::note(self.target, &self.o.window, f).await
    }

    /// The target's window and the move's record, before the first write a put-back undoes.
    async fn record(&mut self, namespaces: &[String], paused: &Paused) -> Result<()> {
        let (c, o) = (self.target, self.o);
        let read = read_window(c, &o.window).await?;
        window_at_least_closed(c, &self.quiet, read).await?;
        record(c, &o.window, |s| {
            let attempts = s.move_record.as_ref().map_or(0, |m| m.attempts);
            s.move_record = Some(MoveRecord {
                phase: MovePhase::Moving,
                started_at: Some(now()),
                attempts: attempts + 1,
                clusters: paused.clusters.clone(),
                cluster_classes: paused.classes.clone(),
                namespaces: namespaces
                    .iter()
                    .map(|n| NamespaceMove {
                        name: n.clone(),
                        state: crate::resources::move_window::NamespaceMoveState::Pending,
                    })
                    .collect(),
                ..MoveRecord::default()
            });
        })
        .await?;
        self.out.say(format!(
            "handoff move -A: {} namespace{}, in this order: {} (each one's Clusters before the namespace of the ClusterClasses they use)",
            namespaces.len(),
            if namespaces.len() == 1 { "" } else { "s" },
            namespaces.join(", ")
        ));
        Ok(())
    }

    /// Every Cluster and ClusterClass paused, so that the providers finish and lift their
    /// block-moves while their controllers still run.
    async fn pause(&mut self, p: &Paused) -> Result<()> {
        let c = self.source;
        for key in &p.clusters {
            patch(
                c,
                CLUSTERS,
                key,
                json!({"spec": {"paused": true}}),
                "pausing",
            )
            .await?;
        }
        for key in &p.classes {
            let ann = json!({"metadata": {"annotations": {PAUSED_ANNOTATION: ""}}});
            patch(c, CLUSTER_CLASSES, key, ann, "pausing").await?;
        }
        self.out.say(format!(
            "{}: paused {} Cluster{} and {} ClusterClass{}, so that the providers finish what they are doing and lift their block-moves",
            c.label,
            p.clusters.len(),
            if p.clusters.len() == 1 { "" } else { "s" },
            p.classes.len(),
            if p.classes.len() == 1 { "" } else { "es" },
        ));
        Ok(())
    }

    /// Until every recorded Cluster is paused and nothing of any namespace holds a provider's
    /// block-move.
    async fn wait_unblocked(&mut self) -> Result<()> {
        let c = self.source;
        let rec = self.read_record().await?;
        let deadline = Instant::now() + self.o.open.wait_timeout;
        let mut said = None;
        loop {
            let mut waits = Vec::new();
            for (ns, _) in &rec.namespaces {
                let clusters = clusters_in(c, ns).await?;
                let blocking = scan(c, ns).await?.blocking;
                if let Err(why) = directory_plan::backup_ready(&clusters, &blocking) {
                    waits.push(why);
                }
            }
            if waits.is_empty() {
                return Ok(());
            }
            let why = waits.join("; ");
            if Instant::now() >= deadline {
                return Err(WindowError::Refused {
                    cluster: c.label.into(),
                    message: format!(
                        "still waiting for {why} after {}s (--wait-timeout): the providers hold the move",
                        self.o.open.wait_timeout.as_secs()
                    ),
                });
            }
            if said.as_ref() != Some(&why) {
                self.out.say(format!("handoff move -A: waiting for {why}"));
                said = Some(why);
            }
            tokio::time::sleep(self.o.poll).await;
        }
    }

    async fn read_record(&self) -> Result<WholeRecord> {
        let r = super::read_record(self.target, &self.o.window).await?;
        Ok(whole_record(&r.unwrap_or_default()))
    }

    /// Both clusters stopped as `window open` stops them, at once (nothing runs clusterctl
    /// before both are proven), and proven.
    async fn stop(&mut self) -> Result<()> {
        self.note(|m| m.phase = MovePhase::StoppingSource).await?;
        let mut o = self.quiet.clone();
        o.reason
            .get_or_insert_with(|| "handoff move --all-namespaces".to_string());
        let both = [self.target.clone(), self.source.clone()];
        open(&both, &o, self.out).await?;
        self.note(|m| {
            m.phase = MovePhase::Copying;
            m.target_stopped_at.get_or_insert_with(now);
            m.source_stopped_at.get_or_insert_with(now);
        })
        .await
    }

    async fn clusterctl(&mut self, namespace: &str) -> Result<Found> {
        self.note(|m| {
            m.phase = MovePhase::Copying;
            m.error = None;
            if let Some(n) = m.namespaces.iter_mut().find(|n| n.name == namespace) {
                n.state = crate::resources::move_window::NamespaceMoveState::Copying;
            }
        })
        .await?;
        let flags = ClusterctlFlags {
            namespace: namespace.to_string(),
            dry_run: false,
            ..self.o.flags.clone()
        };
        let args = clusterctl_args(&flags);
        let prefix = format!("handoff move -A: namespace {namespace}");
        let status =
            super::clusterctl::run_to_end(self.source, &self.o.clusterctl, args, &prefix, self.out)
                .await?;
        let what = format!(
            "clusterctl move -n {namespace} exited {}",
            status.describe()
        );
        Ok(Found::Exited { status, what })
    }

    async fn moved(
        &mut self,
        namespace: &str,
        unpause_classes: &[String],
        unpause_target: &Paused,
    ) -> Result<()> {
        let why = "clusterctl's last step, unpausing the target, had not run";
        let (clusters, classes) = (&unpause_target.clusters, &unpause_target.classes);
        unpause_saying(self.target, clusters, classes, why, self.out).await?;
        self.note(|m| {
            if let Some(n) = m.namespaces.iter_mut().find(|n| n.name == namespace) {
                n.state = crate::resources::move_window::NamespaceMoveState::Moved;
            }
        })
        .await?;
        let why = "clusterctl paused it and left it in the source for the Clusters still to go";
        unpause_saying(self.source, &[], unpause_classes, why, self.out).await
    }

    async fn fail(&mut self, f: &Failure) -> Result<()> {
        self.note(|m| {
            m.phase = MovePhase::Failed;
            m.clusterctl_exit = f.exit;
            m.error = Some(format!("namespace {}: {}", f.namespace, f.what));
        })
        .await?;
        self.out.say(format!(
            "Both clusters' controllers stay stopped, and MoveWindow {} stays open in each: they would reconcile a half-moved management cluster. Two ways on:\n  finish the move: the same command again (clusterctl moves namespace {} again, then the rest)\n  undo it:         the same command with --abort (the namespaces moved already stay in the target)",
            self.o.window, f.namespace
        ));
        Ok(())
    }

    /// One cluster's window closed where it has one, and when recorded.
    async fn restore(&mut self, c: &Cluster, wait_leading: bool) -> Result<()> {
        if read_window(c, &self.o.window).await?.is_some() {
            close(
                std::slice::from_ref(c),
                &self.closing(wait_leading),
                self.out,
            )
            .await?;
        }
        let role = c.role;
        self.note(|m| {
            let at = match role {
                Some(MoveRole::Source) => &mut m.source_back_at,
                _ => &mut m.target_back_at,
            };
            at.get_or_insert_with(now);
        })
        .await
    }

    async fn finish(&mut self) -> Result<()> {
        self.note(|m| m.phase = MovePhase::Done).await?;
        let rec = self.read_record().await?;
        let names: Vec<&str> = rec.namespaces.iter().map(|(n, _)| n.as_str()).collect();
        self.out.say(format!(
            "handoff move -A: moved {} namespace{} ({}) under one stop of both clusters, in {:.1}s",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            self.started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    async fn aborted(
        &mut self,
        moved: &[String],
        in_flight: Option<&str>,
        recorded: bool,
    ) -> Result<()> {
        if recorded {
            self.note(|m| m.phase = MovePhase::Aborted).await?;
        }
        if let Some(ns) = in_flight {
            self.out.say(format!(
                "handoff move -A --abort: what clusterctl had copied of namespace {ns} stays in the target, paused (it is whole in the source): kubectl --kubeconfig … -n {ns} get clusters.cluster.x-k8s.io"
            ));
        }
        self.out.say(match moved.is_empty() {
            true => "handoff move -A --abort: the controllers and the source's Clusters are back as they were".to_string(),
            false => format!(
                "handoff move -A --abort: the controllers are back; namespace{} {} moved already and stay{} in the target, the others in the source",
                if moved.len() == 1 { "" } else { "s" },
                moved.join(", "),
                if moved.len() == 1 { "s" } else { "" },
            ),
        });
        Ok(())
    }

    /// Whether clusterctl had begun deleting `ns` from the source: an object marked or being
    /// deleted, or a recorded Cluster or ClusterClass of it gone from the source.
    async fn deleting(&mut self, ns: &str, recorded: &[String]) -> Result<bool> {
        if ns.is_empty() {
            return Ok(false);
        }
        let s = scan(self.source, ns).await?;
        if !s.deleting.is_empty() {
            return Ok(true);
        }
        let mut now: Vec<String> = clusters_in(self.source, ns)
            .await?
            .into_iter()
            .map(|c| c.key)
            .collect();
        now.extend(every_class(self.source).await?.into_iter().map(|c| c.key));
        Ok(recorded
            .iter()
            .filter(|k| crate::window::plan::move_plan::namespace_of(k) == ns)
            .any(|k| !now.contains(k)))
    }
}
