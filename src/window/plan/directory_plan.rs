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
//! again (it updates what exists already: `createTargetObject`), or `--abort` restores them.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::resources::move_window::MoveRecord;
use crate::window::plan::declare::Of;
use crate::window::plan::move_plan::ClusterSeen;

/// Which way the objects go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    /// `--to-directory`: from the cluster into the folder, for the namespace.
    Backup { namespace: String },
    /// `--from-directory`: from the folder into the cluster.
    Restore,
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
}

/// `clusterctl move` for a backup or a restore, with the user's flags.
pub fn clusterctl_args(f: &DirectoryFlags) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["move".into()];
    let (kubeconfig, context) = match f.direction {
        Direction::Backup { .. } => ("--kubeconfig", "--kubeconfig-context"),
        Direction::Restore => ("--to-kubeconfig", "--to-kubeconfig-context"),
    };
    if let Some(k) = &f.kubeconfig {
        a.push(kubeconfig.into());
        a.push(k.into());
    }
    if let Some(c) = &f.context {
        a.push(context.into());
        a.push(c.into());
    }
    match &f.direction {
        Direction::Backup { namespace } => {
            a.push("--namespace".into());
            a.push(namespace.into());
            a.push("--to-directory".into());
        }
        Direction::Restore => a.push("--from-directory".into()),
    }
    a.push((&f.directory).into());
    a
}

pub use crate::window::plan::directory_next::DirectoryStep;

impl Direction {
    /// Whose steps these are.
    pub fn of(&self) -> Of {
        match self {
            Direction::Backup { .. } => Of::Backup,
            Direction::Restore => Of::Restore,
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
        "Cluster {} in namespace {namespace} is paused, and not by MoveWindow {window}: clusterctl backs up no paused Cluster (checkClustersNotPaused); unpause it, or back up once whoever paused it is done",
        .clusters.join(", ")
    )]
    PausedByOthers {
        clusters: Vec<String>,
        namespace: String,
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
        Direction::Restore => Vec::new(),
    };
    if abort {
        return Start {
            unpause,
            close: open,
            then: Then::Aborted,
        };
    }
    match direction {
        Direction::Backup { namespace } => {
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
                    namespace: namespace.clone(),
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
        Direction::Restore => Start {
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
            namespace: "ns1".into(),
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
        };
        assert_eq!(
            clusterctl_args(&f),
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
            direction: Direction::Restore,
            directory: "/b".into(),
            kubeconfig: Some("/t".into()),
            context: None,
        };
        assert_eq!(
            clusterctl_args(&f),
            ["move", "--to-kubeconfig", "/t", "--from-directory", "/b"].map(OsString::from)
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
        let s = start(&Direction::Restore, true, "w", true, None, &[]);
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
        let s = start(&Direction::Restore, false, "w", true, None, &[]);
        assert_eq!(
            s.then,
            Then::Run {
                stopped_already: true
            }
        );
        assert!(!s.close);
        let s = start(&Direction::Restore, false, "w", false, None, &[]);
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
