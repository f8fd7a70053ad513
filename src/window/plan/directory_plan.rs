//! `handoff move --to-directory` and `--from-directory` decided: clusterctl's backup and
//! restore, each with one cluster's controllers stopped around it. No I/O here.
//!
//! A backup (`mover.go`, `toDirectory`) pauses the namespace's Clusters and writes them out at
//! once: unlike a move it waits for no provider's block-move, and it refuses a Cluster that is
//! paused already (`checkClustersNotPaused`). So handoff pauses them itself first, waits until
//! the providers have lifted their block-move (they do so only while their controllers run,
//! once they see the pause), stops the controllers, and unpauses the Clusters again, which
//! nothing reconciles now; clusterctl then pauses, writes and unpauses them with every
//! controller stopped. The Clusters handoff pauses are recorded first (those running when it
//! began), so a run that died anywhere is put back by the next: each recorded Cluster that is
//! paused now was paused by handoff or by clusterctl, and is unpaused.
//!
//! A restore (`fromDirectory`) creates the objects in the target, paused, and unpauses the
//! Clusters last. The target's controllers are stopped before the first create and restored
//! after the last unpause; a restore that failed keeps them stopped (a controller reconciling
//! half a restore is what this exists to prevent), and the same command again runs clusterctl
//! again (it skips what exists already: `restoreTargetObject`), or `--abort` restores them.
//!
//! With `--all-namespaces` a backup writes each namespace into a folder of its own, named after
//! it, and a restore creates each such folder's objects: clusterctl once per namespace, under
//! one stop of the cluster. A backup copies the ClusterClasses of another namespace that its
//! Clusters use along with them (`objectgraph.go`, `Discovery`), and a restore skips what is
//! there already, so neither depends on the order; both go by name.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::resources::move_window::MoveRecord;
use crate::window::plan::declare::Of;
use crate::window::plan::move_plan::ClusterSeen;

/// Which way the objects go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    /// `--to-directory`: from the cluster into the folder, for these namespaces (one, or with
    /// `-A` each that holds something clusterctl moves).
    Backup { namespaces: Vec<String> },
    /// `--from-directory`: from the folder into the cluster; with `-A`, these namespaces'
    /// folders of it (none: the folder itself, whatever it holds).
    Restore { namespaces: Vec<String> },
}

/// clusterctl's flags for one cluster and one folder, as the user gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryFlags {
    pub direction: Direction,
    pub directory: PathBuf,
    /// The cluster's kubeconfig: the source of a backup (`--kubeconfig`), the target of a
    /// restore (`--to-kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// `-A`: each namespace's files in a folder of `directory` named after it.
    pub whole: bool,
}

/// One clusterctl of a backup or a restore: the namespace it is for (`-A`) and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterctlRun {
    pub namespace: Option<String>,
    pub folder: PathBuf,
    pub args: Vec<OsString>,
}

/// `clusterctl move` for a backup or a restore, with the user's flags: one run, or with `-A`
/// one per namespace, each with its folder.
pub fn clusterctl_runs(f: &DirectoryFlags) -> Vec<ClusterctlRun> {
    let (namespaces, restore) = match &f.direction {
        Direction::Backup { namespaces } => (namespaces, false),
        Direction::Restore { namespaces } => (namespaces, true),
    };
    let run = |namespace: Option<&String>, folder: PathBuf| {
        let mut a: Vec<OsString> = vec!["move".into()];
        let (kubeconfig, context) = match restore {
            false => ("--kubeconfig", "--kubeconfig-context"),
            true => ("--to-kubeconfig", "--to-kubeconfig-context"),
        };
        if let Some(k) = &f.kubeconfig {
            a.push(kubeconfig.into());
            a.push(k.into());
        }
        if let Some(c) = &f.context {
            a.push(context.into());
            a.push(c.into());
        }
        match (restore, namespace) {
            (false, Some(ns)) => {
                a.extend(["--namespace".into(), ns.into(), "--to-directory".into()]);
            }
            (false, None) => a.push("--to-directory".into()),
            (true, _) => a.push("--from-directory".into()),
        }
        a.push((&folder).into());
        ClusterctlRun {
            namespace: f.whole.then(|| namespace.cloned()).flatten(),
            folder,
            args: a,
        }
    };
    match (f.whole, restore) {
        (true, _) => namespaces
            .iter()
            .map(|ns| run(Some(ns), f.directory.join(ns)))
            .collect(),
        (false, false) => namespaces
            .iter()
            .map(|ns| run(Some(ns), f.directory.clone()))
            .collect(),
        (false, true) => vec![run(None, f.directory.clone())],
    }
}

pub use crate::window::plan::directory_next::DirectoryStep;

impl Direction {
    /// Whose steps these are.
    pub fn of(&self) -> Of {
        match self {
            Direction::Backup { .. } => Of::Backup,
            Direction::Restore { .. } => Of::Restore,
        }
    }
}

/// What a run does first, from what the cluster holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// Clusters (`namespace/name`) to unpause before anything else: recorded by an earlier
    /// backup as running when it began, and paused now (by it or by clusterctl).
    pub unpause: Vec<String>,
    /// Close the window an earlier run left open, restoring its controllers, before going on.
    pub close: bool,
    pub then: Then,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    /// Stop the controllers (a restore whose window is open already keeps them stopped), run
    /// clusterctl, restore them.
    Run { stopped_already: bool },
    /// `--abort`: the controllers are back; nothing more.
    Aborted,
    /// Nothing started: why.
    Refuse(DirectoryRefusal),
}

/// Why a backup does not start: kept typed to the command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryRefusal {
    /// These Clusters (`namespace/name`) are paused, and not by this window.
    #[error(
        "Cluster {} is paused, and not by MoveWindow {window}: clusterctl backs up no paused Cluster (checkClustersNotPaused); unpause it, or back up once whoever paused it is done",
        .clusters.join(", ")
    )]
    PausedByOthers {
        clusters: Vec<String>,
        window: String,
    },
}

/// The start of a run. `open`: the window is open; `record`: what it recorded; `clusters`:
/// the namespace's Clusters now (a backup's; none for a restore).
pub fn start(
    direction: &Direction,
    abort: bool,
    window: &str,
    open: bool,
    record: Option<&MoveRecord>,
    clusters: &[ClusterSeen],
) -> Start {
    let recorded: &[String] = record.map(|r| r.clusters.as_slice()).unwrap_or(&[]);
    let unpause: Vec<String> = match direction {
        Direction::Backup { .. } => {
            crate::window::plan::move_plan::to_unpause(&[], recorded, clusters)
        }
        Direction::Restore { .. } => Vec::new(),
    };
    if abort {
        return Start {
            unpause,
            close: open,
            then: Then::Aborted,
        };
    }
    match direction {
        Direction::Backup { .. } => {
            // clusterctl refuses a paused Cluster; one handoff did not pause is the user's.
            let theirs: Vec<&str> = clusters
                .iter()
                .filter(|c| c.paused && !unpause.contains(&c.key))
                .map(|c| c.key.as_str())
                .collect();
            let then = match theirs.is_empty() {
                true => Then::Run {
                    stopped_already: false,
                },
                false => Then::Refuse(DirectoryRefusal::PausedByOthers {
                    clusters: theirs.iter().map(|k| k.to_string()).collect(),
                    window: window.to_string(),
                }),
            };
            // A backup stops its controllers afresh (they must run while the providers lift
            // their block-move), and one that does not go on keeps nothing stopped.
            Start {
                unpause,
                close: open,
                then,
            }
        }
        Direction::Restore { .. } => Start {
            unpause,
            close: false,
            then: Then::Run {
                stopped_already: open,
            },
        },
    }
}

/// Whether a backup may stop the controllers: every Cluster paused, and no object of the
/// namespace holding a block-move (the providers lift theirs once they see the pause).
/// `Err`: what it waits for.
pub fn backup_ready(clusters: &[ClusterSeen], blocking: &[String]) -> Result<(), String> {
    let running: Vec<&str> = clusters
        .iter()
        .filter(|c| !c.paused)
        .map(|c| c.key.as_str())
        .collect();
    if !running.is_empty() {
        return Err(format!("Cluster {} to be paused", running.join(", ")));
    }
    let held: Vec<&str> = clusters
        .iter()
        .filter(|c| c.block_move.is_some())
        .map(|c| c.key.as_str())
        .map(|k| k.rsplit('/').next().unwrap_or(k))
        .collect();
    let mut all: Vec<String> = held.iter().map(|k| format!("Cluster {k}")).collect();
    all.extend(blocking.iter().cloned());
    match all.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "the providers to lift their {} from {}",
            crate::window::plan::move_plan::BLOCK_MOVE,
            all.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, paused: bool) -> ClusterSeen {
        ClusterSeen {
            key: key.into(),
            paused,
            ..ClusterSeen::default()
        }
    }

    fn backup() -> Direction {
        Direction::Backup {
            namespaces: vec!["ns1".into()],
        }
    }

    fn rec(clusters: &[&str]) -> MoveRecord {
        MoveRecord {
            namespace: "ns1".into(),
            clusters: clusters.iter().map(|s| s.to_string()).collect(),
            ..MoveRecord::default()
        }
    }

    #[test]
    fn a_backup_passes_clusterctl_the_source_and_the_namespace() {
        let f = DirectoryFlags {
            direction: backup(),
            directory: "/b u".into(),
            kubeconfig: Some("/a".into()),
            context: Some("ctx".into()),
            whole: false,
        };
        assert_eq!(
            clusterctl_runs(&f)[0].args,
            [
                "move",
                "--kubeconfig",
                "/a",
                "--kubeconfig-context",
                "ctx",
                "--namespace",
                "ns1",
                "--to-directory",
                "/b u"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn a_restore_passes_clusterctl_the_target_and_no_namespace() {
        let f = DirectoryFlags {
            direction: Direction::Restore { namespaces: vec![] },
            directory: "/b".into(),
            kubeconfig: Some("/t".into()),
            context: None,
            whole: false,
        };
        let runs = clusterctl_runs(&f);
        assert_eq!(runs.len(), 1);
        assert_eq!(
            runs[0].args,
            ["move", "--to-kubeconfig", "/t", "--from-directory", "/b"].map(OsString::from)
        );
    }

    #[test]
    fn a_whole_backup_and_restore_run_clusterctl_once_per_namespace_each_in_its_folder() {
        let namespaces = vec!["classes".to_string(), "team-b".to_string()];
        let backup = DirectoryFlags {
            direction: Direction::Backup {
                namespaces: namespaces.clone(),
            },
            directory: "/b".into(),
            kubeconfig: Some("/s".into()),
            context: None,
            whole: true,
        };
        let runs = clusterctl_runs(&backup);
        assert_eq!(
            runs.iter().map(|r| r.args.clone()).collect::<Vec<_>>(),
            [
                [
                    "move",
                    "--kubeconfig",
                    "/s",
                    "--namespace",
                    "classes",
                    "--to-directory",
                    "/b/classes"
                ],
                [
                    "move",
                    "--kubeconfig",
                    "/s",
                    "--namespace",
                    "team-b",
                    "--to-directory",
                    "/b/team-b"
                ],
            ]
            .map(|a| a.map(OsString::from).to_vec())
        );
        assert_eq!(runs[1].namespace.as_deref(), Some("team-b"));
        let restore = DirectoryFlags {
            direction: Direction::Restore { namespaces },
            kubeconfig: Some("/t".into()),
            ..backup
        };
        let runs = clusterctl_runs(&restore);
        assert_eq!(
            runs.iter().map(|r| r.args.clone()).collect::<Vec<_>>(),
            [
                [
                    "move",
                    "--to-kubeconfig",
                    "/t",
                    "--from-directory",
                    "/b/classes"
                ],
                [
                    "move",
                    "--to-kubeconfig",
                    "/t",
                    "--from-directory",
                    "/b/team-b"
                ],
            ]
            .map(|a| a.map(OsString::from).to_vec())
        );
    }

    #[test]
    fn a_fresh_backup_runs() {
        let s = start(
            &backup(),
            false,
            "backup-ns1",
            false,
            None,
            &[c("ns1/a", false)],
        );
        assert_eq!(
            s,
            Start {
                unpause: vec![],
                close: false,
                then: Then::Run {
                    stopped_already: false
                }
            }
        );
    }

    #[test]
    fn a_backup_that_died_is_put_back_and_run_again() {
        // Paused by handoff or clusterctl (recorded running at the start): unpaused; the
        // window it left open is closed, so the providers can lift their block-move again.
        let r = rec(&["ns1/a", "ns1/b"]);
        let s = start(
            &backup(),
            false,
            "backup-ns1",
            true,
            Some(&r),
            &[c("ns1/a", true), c("ns1/b", false)],
        );
        assert_eq!(s.unpause, ["ns1/a"]);
        assert!(s.close);
        assert_eq!(
            s.then,
            Then::Run {
                stopped_already: false
            }
        );
    }

    #[test]
    fn a_cluster_somebody_else_paused_refuses_the_backup_and_is_left_alone() {
        let r = rec(&["ns1/a"]);
        let s = start(
            &backup(),
            false,
            "backup-ns1",
            true,
            Some(&r),
            &[c("ns1/a", true), c("ns1/theirs", true)],
        );
        assert_eq!(s.unpause, ["ns1/a"]);
        assert!(
            s.close,
            "nothing kept stopped for a backup that does not go on"
        );
        match s.then {
            Then::Refuse(DirectoryRefusal::PausedByOthers { clusters, .. }) => {
                assert_eq!(clusters, ["ns1/theirs"])
            }
            t => panic!("{t:?}"),
        }
        // Not recorded: never unpaused, even on --abort.
        let s = start(
            &backup(),
            true,
            "backup-ns1",
            false,
            None,
            &[c("ns1/theirs", true)],
        );
        assert!(s.unpause.is_empty());
        assert_eq!(s.then, Then::Aborted);
    }

    #[test]
    fn an_abort_puts_everything_back_and_goes_no_further() {
        let r = rec(&["ns1/a"]);
        let s = start(&backup(), true, "w", true, Some(&r), &[c("ns1/a", true)]);
        assert_eq!(
            s,
            Start {
                unpause: vec!["ns1/a".into()],
                close: true,
                then: Then::Aborted
            }
        );
        let s = start(
            &Direction::Restore { namespaces: vec![] },
            true,
            "w",
            true,
            None,
            &[],
        );
        assert_eq!(
            s,
            Start {
                unpause: vec![],
                close: true,
                then: Then::Aborted
            }
        );
    }

    #[test]
    fn a_restore_run_again_keeps_its_controllers_stopped() {
        let s = start(
            &Direction::Restore { namespaces: vec![] },
            false,
            "w",
            true,
            None,
            &[],
        );
        assert_eq!(
            s.then,
            Then::Run {
                stopped_already: true
            }
        );
        assert!(!s.close);
        let s = start(
            &Direction::Restore { namespaces: vec![] },
            false,
            "w",
            false,
            None,
            &[],
        );
        assert_eq!(
            s.then,
            Then::Run {
                stopped_already: false
            }
        );
    }

    #[test]
    fn a_backup_stops_once_paused_and_unblocked() {
        let mut a = c("ns1/a", true);
        assert_eq!(backup_ready(&[a.clone()], &[]), Ok(()));
        assert!(
            backup_ready(&[c("ns1/a", false)], &[])
                .unwrap_err()
                .contains("Cluster ns1/a to be paused")
        );
        let e = backup_ready(&[a.clone()], &["DockerCluster ns1/a".into()]).unwrap_err();
        assert!(e.contains("DockerCluster ns1/a"), "{e}");
        a.block_move = Some("x".into());
        assert!(backup_ready(&[a], &[]).unwrap_err().contains("Cluster a"));
    }
}
