//! `handoff move`'s plan, pure: where a run starts given what an earlier one recorded, which
//! Clusters get handoff's block-move, when the source may be stopped, which Clusters a re-run
//! unpauses, clusterctl's command line, and what to tell the user when it fails.
//!
//! The order it keeps follows clusterctl's own (`cmd/clusterctl/client/cluster/mover.go` in
//! kubernetes-sigs/cluster-api, `objectMover.move`): refuse paused Clusters
//! (`checkClustersNotPaused`), pause the Clusters and ClusterClasses, wait while any object that
//! carried `clusterctl.cluster.x-k8s.io/block-move` at discovery still carries it
//! (`waitReadyForMove`: 5 s × 1.5, 10 attempts per object, about 6 minutes), create in the
//! target in owner order, delete from the source, unpause the target.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::resources::move_window::MoveRecord;
use crate::resources::phase::{MovePhase, UnknownPhase};

/// clusterctl's annotation: an object that carries it at discovery holds the move until it is
/// removed (`clusterctlv1.BlockMoveAnnotation`).
pub const BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// Cluster API's pause annotation (`clusterv1.PausedAnnotation`), which clusterctl's paused
/// check reads beside `spec.paused`.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// The value of handoff's own block-move, so it is never mistaken for a provider's.
pub fn block_move_value(window: &str) -> String {
    format!("handoff.dev/move-window/{window}")
}

/// A source Cluster (or ClusterClass) as the plan reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSeen {
    /// `namespace/name`.
    pub key: String,
    /// `spec.paused`, or the paused annotation.
    pub paused: bool,
    /// The value of its block-move annotation, if it carries one.
    pub block_move: Option<String>,
    /// A topology Cluster's ClusterClass (`namespace/name`, its namespace defaulting to the
    /// Cluster's, as `Cluster.GetClassKey` reads it); `None` for a ClusterClass.
    pub class: Option<String>,
}

/// The namespace of a `namespace/name` key.
pub fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

/// What a move of namespace `ns` acts on in the source, from its every Cluster and every
/// ClusterClass: its Clusters, the Clusters of other namespaces that use one of its
/// ClusterClasses, and the ClusterClasses it touches (`classes_used`, and its own), sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub clusters: Vec<ClusterSeen>,
    pub class_users: Vec<ClusterSeen>,
    pub classes: Vec<ClusterSeen>,
}

pub fn scope(
    ns: &str,
    every_cluster: &[ClusterSeen],
    every_class: Vec<ClusterSeen>,
    recorded: &[String],
) -> Scope {
    let clusters: Vec<ClusterSeen> = every_cluster
        .iter()
        .filter(|c| namespace_of(&c.key) == ns)
        .cloned()
        .collect();
    let used = classes_used(ns, &clusters, recorded);
    let mut classes: Vec<ClusterSeen> = every_class
        .into_iter()
        .filter(|k| namespace_of(&k.key) == ns || used.contains(&k.key))
        .collect();
    classes.sort_by(|a, b| a.key.cmp(&b.key));
    Scope {
        class_users: users_of(ns, every_cluster),
        clusters,
        classes,
    }
}

/// The ClusterClasses a move of `ns` touches in the source, beside the namespace's own: those
/// its Clusters use in other namespaces (clusterctl discovers, pauses and copies them, and
/// never deletes them from the source: `objectgraph.go`, `Discovery` and `setShouldNotDelete`)
/// and those an earlier attempt recorded. Sorted, each once.
pub fn classes_used(ns: &str, clusters: &[ClusterSeen], recorded: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = clusters
        .iter()
        .filter_map(|c| c.class.clone())
        .chain(recorded.iter().cloned())
        .filter(|k| namespace_of(k) != ns)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The Clusters of other namespaces that use a ClusterClass of `ns`: while one is in the
/// source, clusterctl copies the class and leaves it in the source too.
pub fn users_of(ns: &str, every_cluster: &[ClusterSeen]) -> Vec<ClusterSeen> {
    every_cluster
        .iter()
        .filter(|c| namespace_of(&c.key) != ns)
        .filter(|c| c.class.as_deref().is_some_and(|k| namespace_of(k) == ns))
        .cloned()
        .collect()
}

/// The ClusterClasses, of those a move touches, that clusterctl leaves in the source: every
/// one of another namespace, and the namespace's own that `users` (Clusters of other
/// namespaces) use.
pub fn classes_left_behind(
    ns: &str,
    classes: &[ClusterSeen],
    users: &[ClusterSeen],
) -> Vec<String> {
    classes
        .iter()
        .filter(|c| {
            namespace_of(&c.key) != ns || users.iter().any(|u| u.class.as_ref() == Some(&c.key))
        })
        .map(|c| c.key.clone())
        .collect()
}

/// What is paused in the source before a move starts, which clusterctl refuses to move
/// (`checkClustersNotPaused`, `checkClusterClassesNotPaused`, v1.12+), said with the command
/// that unpauses each; `None` when nothing is.
pub fn paused_before(clusters: &[ClusterSeen], classes: &[ClusterSeen]) -> Option<Paused> {
    let keys = |v: &[ClusterSeen]| -> Vec<String> {
        v.iter()
            .filter(|c| c.paused)
            .map(|c| c.key.clone())
            .collect()
    };
    let p = Paused {
        clusters: keys(clusters),
        classes: keys(classes),
    };
    (!p.clusters.is_empty() || !p.classes.is_empty()).then_some(p)
}

/// Clusters and ClusterClasses (`namespace/name`) that are paused: before a move (its
/// refusal, said with the command that unpauses each), or by clusterctl in an attempt that did
/// not finish (what a resumed move unpauses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Paused {
    pub clusters: Vec<String>,
    pub classes: Vec<String>,
}

impl std::fmt::Display for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("these are paused, and clusterctl move refuses to start while any Cluster or ClusterClass it would move is (since v1.12); unpause them, or move without them:")?;
        let split = |k: &str| -> (String, String) {
            let (ns, name) = k.split_once('/').unwrap_or(("", k));
            (ns.to_string(), name.to_string())
        };
        for k in &self.clusters {
            let (ns, name) = split(k);
            write!(
                f,
                "\n  Cluster {k}: kubectl -n {ns} patch clusters.cluster.x-k8s.io {name} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'"
            )?;
        }
        for k in &self.classes {
            let (ns, name) = split(k);
            write!(
                f,
                "\n  ClusterClass {k}: kubectl -n {ns} annotate clusterclasses.cluster.x-k8s.io {name} {PAUSED_ANNOTATION}-"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Paused {}

/// Why the move's planner refuses to start or to go on: kept typed from the planner to the
/// command line, which says it once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Start(#[from] StartError),
    /// `--abort` past the point where the source could be put back (`abort_refused`).
    #[error(
        "cannot abort the move of namespace {namespace}: {}, so an abort cannot put it back (the source's controllers would re-create what was deleted); run the same command without --abort to finish the move (if the target cannot take it, `handoff window close` on each cluster restores the controllers by hand)",
        past(.start)
    )]
    AbortPast { namespace: String, start: Start },
    #[error(transparent)]
    Paused(#[from] Paused),
    #[error(transparent)]
    BlockMove(#[from] BlockMoveError),
    #[error(transparent)]
    Clusterctl(#[from] ClusterctlVersion),
    /// The target's window no longer records the move this run was resuming (someone
    /// removed it meanwhile).
    #[error(
        "MoveWindow {0} no longer records the move it was resuming; run the same command again"
    )]
    RecordGone(String),
}

fn past(start: &Start) -> &'static str {
    match start {
        Start::ResumeStopped => "clusterctl had begun deleting it from the source",
        Start::FinishTarget => "clusterctl had copied it and deleted it from the source",
        _ => "clusterctl had moved it",
    }
}

/// Where a run starts, from what the target's window recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// No move recorded, or the last one ended (done or aborted): a new move.
    Fresh,
    /// A move that did not finish before clusterctl succeeded (it failed, was interrupted,
    /// or handoff died) and had deleted nothing from the source: put the source back as
    /// clusterctl expects it (running, unpaused, handoff's block-move on), then move again.
    Resume,
    /// Such a move after clusterctl had begun deleting from the source: restarting the
    /// source's controllers would re-create what was deleted (a MachineSet whose Machines are
    /// gone makes new ones). The source stays stopped; its Clusters are unpaused (nothing
    /// reconciles them) so that clusterctl starts, and clusterctl finishes the copy and the
    /// deletes.
    ResumeStopped,
    /// Everything was copied and deleted, and clusterctl did not unpause the target (its
    /// last step): unpause the target's Clusters, then restore.
    FinishTarget,
    /// clusterctl succeeded and the restore did not finish: restore only.
    RestoreOnly,
    /// The move of this namespace is recorded done and its Clusters are all in the target
    /// and gone from the source, but what its windows brought along may be left (a run that
    /// died while removing it): remove it, and move nothing.
    Tidy,
}

/// Why a run may not start from what the target's window recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error(
        "an --abort of the move of namespace {namespace:?} did not finish; run it again with --abort"
    )]
    AbortUnfinished { namespace: String },
    #[error(
        "the window records an unfinished move of namespace {namespace:?} ({phase}); finish it (same command with --namespace {namespace}) or abort it (--abort) first"
    )]
    OtherNamespace { namespace: String, phase: MovePhase },
    #[error("{0}")]
    UnknownPhase(#[from] UnknownPhase),
}

pub fn start(
    record: Option<&MoveRecord>,
    window: &str,
    namespace: &str,
) -> Result<Start, StartError> {
    let Some(r) = record else {
        return Ok(Start::Fresh);
    };
    // Nothing is resumed, aborted or started over a record this version cannot read.
    r.phase.known(window)?;
    // An unrecorded phase is no move: an --abort of a move that had recorded nothing used to
    // leave such a record (of no namespace), which would refuse every later move.
    if r.phase.is_over() {
        return Ok(Start::Fresh);
    }
    if r.phase == MovePhase::Aborting {
        return Err(StartError::AbortUnfinished {
            namespace: r.namespace.clone(),
        });
    }
    if r.namespace != namespace {
        return Err(StartError::OtherNamespace {
            namespace: r.namespace.clone(),
            phase: r.phase.clone(),
        });
    }
    Ok(match r.clusterctl_exit {
        Some(0) => Start::RestoreOnly,
        _ => Start::Resume,
    })
}

/// A move recorded done whose Clusters are all in the target and none in the source: the
/// same command again has nothing left to move (`Start::Tidy`).
pub fn moved_already(
    record: &MoveRecord,
    namespace: &str,
    source: &[ClusterSeen],
    target: &[ClusterSeen],
) -> bool {
    record.phase == MovePhase::Done
        && record.namespace == namespace
        && !record.clusters.is_empty()
        && record
            .clusters
            .iter()
            .all(|k| target.iter().any(|c| &c.key == k))
        && !record
            .clusters
            .iter()
            .any(|k| source.iter().any(|c| &c.key == k))
}

/// A resumed move, refined by what the clusters hold now: whether clusterctl had begun deleting
/// from the source (an object marked `delete-for-move` or being deleted, or a Cluster of the
/// move's start gone from the source and present in the target).
pub fn resume(
    record: &MoveRecord,
    source: &[ClusterSeen],
    target: &[ClusterSeen],
    deleting: bool,
) -> Start {
    let in_source = |k: &String| source.iter().any(|c| &c.key == k);
    let in_target = |k: &String| target.iter().any(|c| &c.key == k);
    let moved: Vec<&String> = record
        .clusters
        .iter()
        .filter(|k| !in_source(k) && in_target(k))
        .collect();
    if !record.clusters.is_empty() && moved.len() == record.clusters.len() && !deleting {
        return Start::FinishTarget;
    }
    if deleting || !moved.is_empty() {
        return Start::ResumeStopped;
    }
    Start::Resume
}

/// Why `--abort` must not act on a move that starts at `start`: once clusterctl has begun
/// deleting from the source (or has moved everything), restarting the source's controllers
/// would re-create what was deleted and the namespace would be whole in neither cluster. The
/// only way on is forward: the same command finishes the move.
pub fn abort_refused(start: &Start, namespace: &str) -> Option<Refusal> {
    match start {
        Start::ResumeStopped | Start::FinishTarget | Start::RestoreOnly => {
            Some(Refusal::AbortPast {
                namespace: namespace.to_string(),
                start: start.clone(),
            })
        }
        Start::Fresh | Start::Resume | Start::Tidy => None,
    }
}

/// The first clusterctl that waits for `clusterctl.cluster.x-k8s.io/block-move`
/// (`waitReadyForMove`, kubernetes-sigs/cluster-api v1.6.0).
pub const BLOCK_MOVE_SINCE: (u64, u64) = (1, 6);

/// What `clusterctl version -o short` says about its block-move wait, which is all that holds
/// its copy until both clusters are proven stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterctlVersion {
    #[error(
        "clusterctl {0} is older than v1.6, the first that waits for {BLOCK_MOVE} (mover.go waitReadyForMove): nothing would hold its copy until both clusters' controllers are proven stopped; use clusterctl v1.6 or later"
    )]
    TooOld(String),
    #[error(
        "cannot tell clusterctl's version from {0:?}; handoff relies on its wait for {BLOCK_MOVE} (clusterctl v1.6 and later)"
    )]
    Unreadable(String),
}

/// `Ok` for a clusterctl that honours block-move: `v1.13.0`, `v1.6.0-rc.1`, `1.10.2+dirty`.
pub fn block_move_honoured(version: &str) -> Result<(), ClusterctlVersion> {
    let said = version.trim();
    let parse = || -> Option<(u64, u64)> {
        let v = said.split_whitespace().next()?.trim_start_matches('v');
        let mut parts = v.split(['.', '-', '+']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    match parse() {
        Some(v) if v >= BLOCK_MOVE_SINCE => Ok(()),
        Some(_) => Err(ClusterctlVersion::TooOld(said.to_string())),
        None => Err(ClusterctlVersion::Unreadable(said.to_string())),
    }
}

/// Why handoff's block-move could not hold clusterctl until the source is stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockMoveError {
    #[error(
        "the namespace holds no Cluster and no ClusterClass, so clusterctl would move nothing of Cluster API's and nothing would hold it until the source's controllers are stopped; check --namespace"
    )]
    NoCluster,
    /// These objects carry a block-move of someone else's.
    #[error(
        "{} already carries a {BLOCK_MOVE} that is not handoff's, which its owner lifts on its own time, so handoff's could not hold clusterctl until the source's controllers are stopped; remove it, or move by hand (handoff window open/close)",
        .0.join(", ")
    )]
    Foreign(Vec<String>),
    /// The namespace holds ClusterClasses alone, and these Clusters of other namespaces use
    /// them (`Cluster namespace/name`, `ClusterClass namespace/name`).
    #[error(
        "the namespace holds ClusterClasses and no Cluster, and Clusters of other namespaces still use them in the source: {}; clusterctl would copy the classes and leave them in the source (it never deletes a ClusterClass that a Cluster outside the moved namespace uses), so nothing would move: move those namespaces first, this one last",
        .0.iter().map(|(c, k)| format!("Cluster {c} uses ClusterClass {k}")).collect::<Vec<_>>().join(", ")
    )]
    ClassesInUse(Vec<(String, String)>),
}

/// The kind of object handoff's block-move goes on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Holds {
    #[default]
    Clusters,
    /// A namespace of ClusterClasses alone: they are what clusterctl's graph starts from
    /// (Cluster, ClusterClass and ClusterResourceSet are its force-move roots, `objectgraph.go`),
    /// and one that carries a block-move at discovery holds the move (`waitReadyForMove`).
    ClusterClasses,
}

/// Where handoff's block-move goes: the objects (`namespace/name`) and their kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockMoveOn {
    pub holds: Holds,
    pub keys: Vec<String>,
}

impl BlockMoveOn {
    pub fn clusters(keys: Vec<String>) -> BlockMoveOn {
        BlockMoveOn {
            holds: Holds::Clusters,
            keys,
        }
    }

    /// The objects, as said to the user (`Cluster ns/a, ns/b`).
    pub fn describe(&self) -> String {
        let kind = match self.holds {
            Holds::Clusters => "Cluster",
            Holds::ClusterClasses => "ClusterClass",
        };
        format!("{kind} {}", self.keys.join(", "))
    }
}

/// What `handoff move --dry-run` says handoff would do of the block-move, from the source's
/// Cluster API objects (`users`: the Clusters of other namespaces that use a ClusterClass of
/// `ns`): where it goes or why it cannot, what is paused, and which ClusterClasses clusterctl
/// leaves in the source (said only where the block-move holds).
pub fn dry_run(
    ns: &str,
    window: &str,
    clusters: &[ClusterSeen],
    classes: &[ClusterSeen],
    users: &[ClusterSeen],
) -> DryRun {
    let held = add_block_move(ns, clusters, classes, users, window);
    let behind = match held.is_ok() {
        true => classes_left_behind(ns, classes, users),
        false => Vec::new(),
    };
    DryRun {
        held,
        paused: paused_before(clusters, classes),
        behind,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryRun {
    pub held: Result<BlockMoveOn, BlockMoveError>,
    pub paused: Option<Paused>,
    pub behind: Vec<String>,
}

/// Where handoff puts its block-move: every Cluster in scope, or where the namespace holds
/// none, its own ClusterClasses (`classes`: those of `ns` among them count). `Err` when nothing
/// would hold clusterctl until the source is stopped: nothing in scope, or an object that
/// already carries a block-move that is not handoff's (a provider's: it lifts it after the
/// pause, on its own time, and handoff leaves it alone); and for a namespace of ClusterClasses
/// alone, when Clusters of other namespaces (`users`) still use them in the source.
pub fn add_block_move(
    ns: &str,
    clusters: &[ClusterSeen],
    classes: &[ClusterSeen],
    users: &[ClusterSeen],
    window: &str,
) -> Result<BlockMoveOn, BlockMoveError> {
    let own: Vec<&ClusterSeen> = classes
        .iter()
        .filter(|c| namespace_of(&c.key) == ns)
        .collect();
    let (holds, objects): (Holds, Vec<&ClusterSeen>) = match (clusters.is_empty(), own.is_empty()) {
        (false, _) => (Holds::Clusters, clusters.iter().collect()),
        (true, false) => (Holds::ClusterClasses, own),
        (true, true) => return Err(BlockMoveError::NoCluster),
    };
    if holds == Holds::ClusterClasses && !users.is_empty() {
        return Err(BlockMoveError::ClassesInUse(
            users
                .iter()
                .map(|u| (u.key.clone(), u.class.clone().unwrap_or_default()))
                .collect(),
        ));
    }
    let ours = block_move_value(window);
    let foreign: Vec<String> = objects
        .iter()
        .filter(|c| c.block_move.as_deref().is_some_and(|v| v != ours))
        .map(|c| match holds {
            Holds::Clusters => format!("Cluster {}", c.key),
            Holds::ClusterClasses => format!("ClusterClass {}", c.key),
        })
        .collect();
    if !foreign.is_empty() {
        return Err(BlockMoveError::Foreign(foreign));
    }
    Ok(BlockMoveOn {
        holds,
        keys: objects.iter().map(|c| c.key.clone()).collect(),
    })
}

/// Whether a block-move's value is handoff's (of any window): never a provider's to wait for.
pub fn is_handoffs(value: &str) -> bool {
    value.starts_with("handoff.dev/move-window/")
}

/// On a re-run: the Clusters (or ClusterClasses) to unpause, those clusterctl paused: handoff
/// saw it pause them, or they were running when the move started (handoff died before it saw
/// the pause; clusterctl dies with handoff) and are paused now.
pub fn to_unpause(seen_paused: &[String], at_start: &[String], now: &[ClusterSeen]) -> Vec<String> {
    now.iter()
        .filter(|c| c.paused && (seen_paused.contains(&c.key) || at_start.contains(&c.key)))
        .map(|c| c.key.clone())
        .collect()
}

/// The ClusterClasses to unpause in the source at the end: recorded when the move started
/// (none was paused then), still in the source and paused now. clusterctl paused them and left
/// them there, for the Clusters of other namespaces that use them (`setShouldNotDelete`),
/// unpausing only their copies in the target (`mover.go`, `move`), so every later move of a
/// namespace that uses them would be refused (`checkClusterClassesNotPaused`). An `--abort`
/// (`elsewhere_only`) unpauses those of other namespaces alone: they are no part of what the
/// abort leaves for the user to decide, the namespace's own Clusters and ClusterClasses.
pub fn classes_to_unpause(
    ns: &str,
    recorded: &[String],
    now: &[ClusterSeen],
    elsewhere_only: bool,
) -> Vec<String> {
    to_unpause(&[], recorded, now)
        .into_iter()
        .filter(|k| !elsewhere_only || namespace_of(k) != ns)
        .collect()
}

/// What the source's stop waits for, said as "waiting for …".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Waiting {
    /// These Clusters, for clusterctl to pause them.
    #[error("clusterctl to pause Cluster {}", .0.join(", "))]
    Pause(Vec<String>),
    /// These objects, for the providers to lift their block-move.
    #[error("the providers to lift their {BLOCK_MOVE} from {}", .0.join(", "))]
    BlockMove(Vec<String>),
}

/// Whether the source's controllers may be stopped: clusterctl has paused every Cluster in
/// scope, and no object but handoff's block-move holds the move any more (the providers have
/// lifted theirs, which they do only while their controllers run). `Err`: what it waits for.
pub fn source_ready(
    clusters: &[ClusterSeen],
    blocking: &[String],
    window: &str,
) -> Result<(), Waiting> {
    let unpaused: Vec<&str> = clusters
        .iter()
        .filter(|c| !c.paused)
        .map(|c| c.key.as_str())
        .collect();
    if !unpaused.is_empty() {
        return Err(Waiting::Pause(
            unpaused.into_iter().map(str::to_string).collect(),
        ));
    }
    let ours = block_move_value(window);
    let others: Vec<&str> = clusters
        .iter()
        .filter(|c| c.block_move.as_deref().is_some_and(|v| v != ours))
        .map(|c| c.key.as_str())
        .chain(blocking.iter().map(String::as_str))
        .collect();
    if !others.is_empty() {
        return Err(Waiting::BlockMove(
            others.into_iter().map(str::to_string).collect(),
        ));
    }
    Ok(())
}

/// clusterctl move's flags, as handoff got them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterctlFlags {
    pub kubeconfig: Option<PathBuf>,
    pub kubeconfig_context: Option<String>,
    pub to_kubeconfig: PathBuf,
    pub to_kubeconfig_context: Option<String>,
    /// Always passed: handoff resolved it as clusterctl would (the source context's
    /// namespace, else `default`), so both act on the same one.
    pub namespace: String,
    pub dry_run: bool,
}

pub fn clusterctl_args(f: &ClusterctlFlags) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["move".into()];
    if let Some(k) = &f.kubeconfig {
        a.push("--kubeconfig".into());
        a.push(k.into());
    }
    if let Some(c) = &f.kubeconfig_context {
        a.push("--kubeconfig-context".into());
        a.push(c.into());
    }
    a.push("--to-kubeconfig".into());
    a.push((&f.to_kubeconfig).into());
    if let Some(c) = &f.to_kubeconfig_context {
        a.push("--to-kubeconfig-context".into());
        a.push(c.into());
    }
    a.push("--namespace".into());
    a.push((&f.namespace).into());
    if f.dry_run {
        a.push("--dry-run".into());
    }
    a
}

/// A word for a POSIX shell, quoted where it must be.
fn q(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The same `handoff move` again, for the messages.
pub fn command_line(f: &ClusterctlFlags, window: &str, clusterctl: &std::path::Path) -> String {
    let mut s = String::from("handoff move");
    if let Some(k) = &f.kubeconfig {
        s.push_str(&format!(" --kubeconfig {}", q(&k.to_string_lossy())));
    }
    if let Some(c) = &f.kubeconfig_context {
        s.push_str(&format!(" --kubeconfig-context {}", q(c)));
    }
    s.push_str(&format!(
        " --to-kubeconfig {}",
        q(&f.to_kubeconfig.to_string_lossy())
    ));
    if let Some(c) = &f.to_kubeconfig_context {
        s.push_str(&format!(" --to-kubeconfig-context {}", q(c)));
    }
    s.push_str(&format!(" --namespace {}", q(&f.namespace)));
    s.push_str(&format!(" --window {}", q(window)));
    if clusterctl != std::path::Path::new("clusterctl") {
        s.push_str(&format!(
            " --clusterctl {}",
            q(&clusterctl.to_string_lossy())
        ));
    }
    s
}

/// What a failed move tells the user: that both clusters stay stopped, what clusterctl left
/// behind with the commands that show it, and the two ways on.
pub fn failure_help(
    f: &ClusterctlFlags,
    window: &str,
    clusterctl: &std::path::Path,
    what: &str,
) -> String {
    let again = command_line(f, window, clusterctl);
    let kc = |k: Option<&PathBuf>, ctx: Option<&String>| {
        let mut s = String::from("kubectl");
        if let Some(k) = k {
            s.push_str(&format!(" --kubeconfig {}", q(&k.to_string_lossy())));
        }
        if let Some(c) = ctx {
            s.push_str(&format!(" --context {}", q(c)));
        }
        s
    };
    let source = kc(f.kubeconfig.as_ref(), f.kubeconfig_context.as_ref());
    let target = kc(Some(&f.to_kubeconfig), f.to_kubeconfig_context.as_ref());
    let ns = q(&f.namespace);
    format!(
        "{what}\n\
         The controllers handoff stopped stay stopped, and MoveWindow {window} stays open, in both clusters (handoff window status --source … --target … shows them). handoff's block-move is off every Cluster.\n\
         What clusterctl left behind, for you to decide:\n\
         \x20 source Clusters it paused:      {source} -n {ns} get clusters.cluster.x-k8s.io -o custom-columns=NAME:.metadata.name,PAUSED:.spec.paused\n\
         \x20 objects it created in the target: {target} -n {ns} get clusters.cluster.x-k8s.io,machinedeployments.cluster.x-k8s.io,machines.cluster.x-k8s.io\n\
         Two ways on:\n\
         \x20 finish the move: {again}\n\
         \x20   (puts the source back as clusterctl expects it: its controllers running, the Clusters clusterctl paused unpaused, handoff's block-move back on; keeps the target stopped; runs clusterctl again)\n\
         \x20 undo the stop:   {again} --abort\n\
         \x20   (brings every controller back as it was, the source's first, since it still owns what was not moved; the paused Clusters and the copies stay as they are; refused once clusterctl has begun deleting from the source, when finishing is the only way on)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, paused: bool, block: Option<&str>) -> ClusterSeen {
        ClusterSeen {
            key: key.into(),
            paused,
            block_move: block.map(String::from),
            class: None,
        }
    }

    fn uses(key: &str, class: &str) -> ClusterSeen {
        ClusterSeen {
            class: Some(class.into()),
            ..c(key, false, None)
        }
    }

    fn record(phase: MovePhase, exit: Option<i32>) -> MoveRecord {
        MoveRecord {
            phase,
            namespace: "clusters".into(),
            clusterctl_exit: exit,
            ..MoveRecord::default()
        }
    }

    #[test]
    fn only_a_clusterctl_that_waits_for_block_move_is_run() {
        for ok in [
            "v1.13.0",
            "v1.6.0-rc.1\n",
            "1.10.2+dirty",
            "v2.0.0",
            "v1.6.0 extra",
        ] {
            assert_eq!(block_move_honoured(ok), Ok(()), "{ok}");
        }
        for old in ["v1.5.3", "v0.4.8", "1.0.0"] {
            assert!(
                matches!(block_move_honoured(old), Err(ClusterctlVersion::TooOld(_))),
                "{old}"
            );
        }
        for unknown in ["", "clusterctl", "vX.Y", "v1"] {
            assert!(
                matches!(
                    block_move_honoured(unknown),
                    Err(ClusterctlVersion::Unreadable(_))
                ),
                "{unknown}"
            );
        }
    }

    #[test]
    fn a_run_starts_where_the_last_one_stopped() {
        assert_eq!(start(None, "move-clusters", "clusters"), Ok(Start::Fresh));
        for done in [MovePhase::Done, MovePhase::Aborted] {
            assert_eq!(
                start(Some(&record(done, Some(0))), "move-clusters", "clusters"),
                Ok(Start::Fresh)
            );
        }
        // What an --abort of a move that had recorded nothing used to leave.
        assert_eq!(
            start(Some(&MoveRecord::default()), "move-clusters", "clusters"),
            Ok(Start::Fresh)
        );
        for phase in [
            MovePhase::StoppingTarget,
            MovePhase::Moving,
            MovePhase::StoppingSource,
            MovePhase::Copying,
            MovePhase::Failed,
        ] {
            assert_eq!(
                start(
                    Some(&record(phase.clone(), None)),
                    "move-clusters",
                    "clusters"
                ),
                Ok(Start::Resume)
            );
            assert_eq!(
                start(Some(&record(phase, Some(1))), "move-clusters", "clusters"),
                Ok(Start::Resume)
            );
        }
        assert_eq!(
            start(
                Some(&record(MovePhase::Restoring, Some(0))),
                "move-clusters",
                "clusters"
            ),
            Ok(Start::RestoreOnly)
        );
        let other = start(
            Some(&record(MovePhase::Failed, Some(1))),
            "move-clusters",
            "elsewhere",
        )
        .unwrap_err()
        .to_string();
        assert!(other.contains("--namespace clusters"), "{other}");
        // A phase another version wrote: refused by name, never resumed or started over.
        let later = start(
            Some(&record(MovePhase::from("Verifying".to_string()), Some(1))),
            "move-clusters",
            "clusters",
        )
        .unwrap_err()
        .to_string();
        assert!(
            later.contains("MoveWindow move-clusters records move phase \"Verifying\""),
            "{later}"
        );
    }

    #[test]
    fn a_resume_after_deletes_keeps_the_source_stopped() {
        let r = MoveRecord {
            clusters: vec!["ns/a".into(), "ns/b".into()],
            ..record(MovePhase::Failed, Some(1))
        };
        let both = [c("ns/a", true, None), c("ns/b", true, None)];
        // Nothing deleted yet: the source runs again for the re-run.
        assert_eq!(
            resume(&r, &both, &[c("ns/a", true, None)], false),
            Start::Resume
        );
        // An object marked for deletion, or a Cluster already gone from the source.
        assert_eq!(resume(&r, &both, &both, true), Start::ResumeStopped);
        assert_eq!(
            resume(&r, &[c("ns/b", true, None)], &both, false),
            Start::ResumeStopped
        );
        // Everything is in the target and gone from the source: only the target's unpause
        // (clusterctl's last step) and the restore are left.
        assert_eq!(resume(&r, &[], &both, false), Start::FinishTarget);
        assert_eq!(resume(&r, &[], &both, true), Start::ResumeStopped);
    }

    #[test]
    fn block_move_is_added_only_where_nobody_else_holds_one() {
        let ours = block_move_value("w");
        let clusters = [c("ns/a", false, None), c("ns/c", false, Some(&ours))];
        let on = add_block_move("ns", &clusters, &[], &[], "w").unwrap();
        assert_eq!(
            on,
            BlockMoveOn::clusters(vec!["ns/a".into(), "ns/c".into()])
        );
        // A provider's own block-move on a Cluster: nothing of handoff's would hold clusterctl.
        let theirs = [c("ns/a", false, None), c("ns/b", false, Some(""))];
        let why = add_block_move("ns", &theirs, &[], &[], "w")
            .unwrap_err()
            .to_string();
        assert!(why.contains("Cluster ns/b"), "{why}");
        let why = add_block_move("ns", &[], &[], &[], "w")
            .unwrap_err()
            .to_string();
        assert!(why.contains("no Cluster and no ClusterClass"), "{why}");
        // Another namespace's ClusterClass the Clusters use is never what holds clusterctl.
        let elsewhere = [c("classes/quick", false, None)];
        assert!(add_block_move("ns", &[], &elsewhere, &[], "w").is_err());
        assert_eq!(
            add_block_move("ns", &clusters, &elsewhere, &[], "w")
                .unwrap()
                .holds,
            Holds::Clusters
        );
    }

    #[test]
    fn a_namespace_of_cluster_classes_alone_is_held_by_its_classes_once_nobody_uses_them() {
        let classes = [
            c("classes/quick", false, None),
            c("classes/big", false, None),
        ];
        let on = add_block_move("classes", &[], &classes, &[], "w").unwrap();
        assert_eq!(on.holds, Holds::ClusterClasses);
        assert_eq!(on.keys, ["classes/quick", "classes/big"]);
        assert_eq!(on.describe(), "ClusterClass classes/quick, classes/big");
        // Clusters of other namespaces still use one in the source: refused, naming them.
        let users = users_of(
            "classes",
            &[
                uses("team-b/b1", "classes/quick"),
                uses("team-c/c1", "elsewhere/other"),
                uses("classes/own", "classes/quick"),
            ],
        );
        assert_eq!(users, [uses("team-b/b1", "classes/quick")]);
        let why = add_block_move("classes", &[], &classes, &users, "w")
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("Cluster team-b/b1 uses ClusterClass classes/quick")
                && why.contains("this one last"),
            "{why}"
        );
        // A class that carries someone else's block-move.
        let theirs = [c("classes/quick", false, Some("provider"))];
        let why = add_block_move("classes", &[], &theirs, &[], "w")
            .unwrap_err()
            .to_string();
        assert!(why.contains("ClusterClass classes/quick"), "{why}");
        assert!(is_handoffs(&block_move_value("w")) && !is_handoffs("provider"));
    }

    #[test]
    fn a_moves_scope_is_its_clusters_their_classes_anywhere_and_who_else_uses_its_own() {
        let every = [
            uses("team-a/a1", "classes/quick"),
            uses("team-b/b1", "team-a/shared"),
            uses("team-b/b2", "classes/quick"),
        ];
        let classes = vec![
            c("team-a/shared", false, None),
            c("classes/quick", true, None),
            c("classes/unused", false, None),
            c("old/recorded", false, None),
            c("team-b/theirs", false, None),
        ];
        let s = scope("team-a", &every, classes.clone(), &["old/recorded".into()]);
        let keys = |v: &[ClusterSeen]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&s.clusters), ["team-a/a1"]);
        assert_eq!(keys(&s.class_users), ["team-b/b1"]);
        assert_eq!(
            keys(&s.classes),
            ["classes/quick", "old/recorded", "team-a/shared"]
        );
        assert!(s.classes[0].paused);
        // The classes alone: the namespace's own and the recorded ones.
        let s = scope("team-a", &[], classes, &["old/recorded".into()]);
        assert!(s.clusters.is_empty() && s.class_users.is_empty());
        assert_eq!(keys(&s.classes), ["old/recorded", "team-a/shared"]);
    }

    #[test]
    fn the_classes_a_move_touches_are_its_clusters_classes_in_any_namespace() {
        let clusters = [
            uses("team-a/a1", "classes/quick"),
            uses("team-a/a2", "classes/quick"),
            uses("team-a/a3", "team-a/local"),
            c("team-a/plain", false, None),
        ];
        assert_eq!(
            classes_used("team-a", &clusters, &["old/recorded".into()]),
            ["classes/quick", "old/recorded"]
        );
        let seen = [
            c("classes/quick", false, None),
            c("team-a/local", false, None),
            c("team-a/shared", false, None),
        ];
        let users = [uses("team-b/b1", "team-a/shared")];
        assert_eq!(
            classes_left_behind("team-a", &seen, &users),
            ["classes/quick", "team-a/shared"]
        );
    }

    #[test]
    fn what_clusterctl_paused_and_left_in_the_source_is_unpaused_at_the_end() {
        let recorded = ["classes/quick".to_string(), "team-a/local".to_string()];
        let now = [
            c("classes/quick", true, None),
            c("team-a/local", true, None),
            // The user's own, paused before the move (the move was refused then) or never
            // part of it: left alone.
            c("classes/other", true, None),
        ];
        assert_eq!(
            classes_to_unpause("team-a", &recorded, &now, false),
            ["classes/quick", "team-a/local"]
        );
        assert_eq!(
            classes_to_unpause("team-a", &recorded, &now, true),
            ["classes/quick"]
        );
        // Gone from the source (clusterctl deleted the namespace's own): nothing to do.
        assert!(classes_to_unpause("team-a", &recorded, &[], false).is_empty());
    }

    #[test]
    fn what_is_paused_before_a_move_is_named_with_the_command_that_unpauses_it() {
        assert_eq!(paused_before(&[c("ns/a", false, None)], &[]), None);
        let why = paused_before(
            &[c("ns/a", true, None)],
            &[c("classes/quick", true, None), c("ns/local", false, None)],
        )
        .unwrap()
        .to_string();
        assert!(
            why.contains("Cluster ns/a: kubectl -n ns patch clusters.cluster.x-k8s.io a"),
            "{why}"
        );
        assert!(
            why.contains(&format!(
                "ClusterClass classes/quick: kubectl -n classes annotate clusterclasses.cluster.x-k8s.io quick {PAUSED_ANNOTATION}-"
            )),
            "{why}"
        );
        assert!(!why.contains("ns/local"), "{why}");
    }

    #[test]
    fn the_source_stops_once_paused_and_unblocked() {
        let ours = block_move_value("w");
        let running = [c("ns/a", false, Some(&ours))];
        assert!(
            source_ready(&running, &[], "w")
                .unwrap_err()
                .to_string()
                .contains("pause Cluster ns/a")
        );
        let paused = [c("ns/a", true, Some(&ours))];
        let blocked = source_ready(&paused, &["DockerCluster ns/a".into()], "w")
            .unwrap_err()
            .to_string();
        assert!(blocked.contains("DockerCluster ns/a"), "{blocked}");
        // A provider's block-move on the Cluster itself counts; handoff's own does not.
        let theirs = [c("ns/a", true, Some(""))];
        assert!(source_ready(&theirs, &[], "w").is_err());
        assert_eq!(source_ready(&paused, &[], "w"), Ok(()));
        // No Cluster in scope: nothing to wait for.
        assert_eq!(source_ready(&[], &[], "w"), Ok(()));
    }

    #[test]
    fn a_rerun_unpauses_only_what_clusterctl_paused() {
        let r = MoveRecord {
            paused_by_clusterctl: vec!["ns/a".into()],
            ..record(MovePhase::Failed, Some(1))
        };
        let now = [
            c("ns/a", true, None),
            c("ns/b", true, None),
            c("ns/c", false, None),
            c("ns/d", true, None),
        ];
        assert_eq!(
            to_unpause(&r.paused_by_clusterctl, &r.clusters, &now),
            ["ns/a"]
        );
        // handoff died before it saw the pause: the Clusters of the move's start count; the
        // user's own paused Cluster (ns/b) stays paused, and refuses the move as clusterctl would.
        let at_start = ["ns/d".to_string(), "ns/c".to_string()];
        assert_eq!(
            to_unpause(&r.paused_by_clusterctl, &at_start, &now),
            ["ns/a", "ns/d"]
        );
    }

    #[test]
    fn clusterctl_gets_the_flags_it_was_given() {
        let f = ClusterctlFlags {
            kubeconfig: Some("/a".into()),
            kubeconfig_context: None,
            to_kubeconfig: "/b b".into(),
            to_kubeconfig_context: Some("ctx".into()),
            namespace: "clusters".into(),
            dry_run: true,
        };
        let args: Vec<String> = clusterctl_args(&f)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "move",
                "--kubeconfig",
                "/a",
                "--to-kubeconfig",
                "/b b",
                "--to-kubeconfig-context",
                "ctx",
                "--namespace",
                "clusters",
                "--dry-run"
            ]
        );
        let line = command_line(&f, "move-clusters", std::path::Path::new("clusterctl"));
        assert_eq!(
            line,
            "handoff move --kubeconfig /a --to-kubeconfig '/b b' --to-kubeconfig-context ctx --namespace clusters --window move-clusters"
        );
        let help = failure_help(
            &f,
            "move-clusters",
            std::path::Path::new("clusterctl"),
            "clusterctl move failed (exit 1)",
        );
        assert!(
            command_line(&f, "w", std::path::Path::new("/opt/clusterctl"))
                .ends_with("--window w --clusterctl /opt/clusterctl")
        );
        assert!(help.contains(&format!("finish the move: {line}")), "{help}");
        assert!(
            help.contains(&format!("undo the stop:   {line} --abort")),
            "{help}"
        );
        assert!(
            help.contains("kubectl --kubeconfig /a -n clusters get clusters"),
            "{help}"
        );
    }

    #[test]
    fn abort_is_refused_once_clusterctl_began_deleting() {
        assert_eq!(abort_refused(&Start::Fresh, "ns1"), None);
        assert_eq!(abort_refused(&Start::Resume, "ns1"), None);
        for s in [
            Start::ResumeStopped,
            Start::FinishTarget,
            Start::RestoreOnly,
        ] {
            let why = abort_refused(&s, "ns1").expect("refused").to_string();
            assert!(
                why.contains("namespace ns1") && why.contains("without --abort"),
                "{why}"
            );
        }
    }
}
