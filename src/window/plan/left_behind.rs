//! What clusterctl would leave behind in a namespace, from its own dry run compared with a
//! listing: not a second copy of its object graph.
//!
//! `clusterctl move --dry-run -v 1` logs every object it would create in the target, as
//! `Creating Kind="name" Namespace="ns"` (`mover.go`, `createTargetObject`, which logs before it
//! returns on a dry run). clusterctl's logger writes the message first and then each value
//! quoted (`cmd/clusterctl/log/logger.go`, `flatten`). What it would delete (`Deleting …`) is
//! not read: the cluster-scoped objects it copies and never deletes are named from handoff's
//! own listing of the move hierarchy's roots (`mover/cluster_api.rs`, `move_hierarchy_roots`).
//! An object of a Cluster API kind that no root reaches is not moved at all: IPAM addresses and
//! claims are the known case (cluster-api #9478).

use std::collections::BTreeSet;

/// What clusterctl's dry run of one namespace says it would create in the target, as `Kind
/// namespace/name` (a cluster-scoped object as `Kind name`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Would {
    pub create: BTreeSet<String>,
}

/// The `Creating` lines of clusterctl's dry-run log; every other line is ignored (its progress,
/// its `Deleting` lines, and the Namespaces it would create).
pub fn parse(log: &str) -> Would {
    let create = log
        .lines()
        .filter_map(|line| line.strip_prefix("Creating "))
        .filter_map(object)
        .collect();
    Would { create }
}

/// `Kind="name" Namespace="ns"` (or without the namespace) as `Kind ns/name`; `None` for
/// anything else, a Namespace among them.
fn object(kvs: &str) -> Option<String> {
    let (kind, rest) = kvs.split_once("=\"")?;
    if kind.is_empty() || kind == "Namespace" || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    let (name, rest) = rest.split_once('"')?;
    let ns = rest
        .trim_start()
        .strip_prefix("Namespace=\"")
        .and_then(|r| r.split_once('"'))
        .map(|(ns, _)| ns)
        .filter(|ns| !ns.is_empty());
    Some(match ns {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    })
}

/// Objects of the namespace (`listed`: every one of a kind clusterctl discovers, as
/// `Kind ns/name`) that clusterctl would not carry at all: no root reaches them.
pub fn not_moved(listed: &[String], would: &Would) -> Vec<String> {
    listed
        .iter()
        .filter(|o| !would.create.contains(*o))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As clusterctl v1.13 logs a dry run at `-v 1` (trimmed).
    const LOG: &str = r#"Performing move...
********************************************************
This is a dry-run move, will not perform any real action
********************************************************
Discovering Cluster API objects
Moving Cluster API objects Clusters=1
Moving Cluster API objects ClusterClasses=1
Pausing the source cluster
Pausing the source ClusterClasses
Creating objects in the target cluster
Creating Cluster="b1" Namespace="team-b"
Creating ClusterClass="quick" Namespace="classes"
Creating SiteIdentity="site-1"
Creating KubeadmControlPlane="b1-x7" Namespace="team-b"
Creating Secret="b1-ca" Namespace="team-b"
Deleting objects from the source cluster
Deleting Secret="b1-ca" Namespace="team-b"
Deleting KubeadmControlPlane="b1-x7" Namespace="team-b"
Deleting Cluster="b1" Namespace="team-b"
Resuming the target ClusterClasses
Resuming the target cluster
"#;

    #[test]
    fn clusterctls_dry_run_log_is_read_as_objects() {
        let w = parse(LOG);
        assert_eq!(
            w.create.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "Cluster team-b/b1",
                "ClusterClass classes/quick",
                "KubeadmControlPlane team-b/b1-x7",
                "Secret team-b/b1-ca",
                "SiteIdentity site-1"
            ]
        );
    }

    #[test]
    fn what_no_root_reaches_is_named() {
        let listed = [
            "Cluster team-b/b1".to_string(),
            "KubeadmControlPlane team-b/b1-x7".to_string(),
            "IPAddressClaim team-b/orphan".to_string(),
        ];
        assert_eq!(
            not_moved(&listed, &parse(LOG)),
            ["IPAddressClaim team-b/orphan"]
        );
    }

    #[test]
    fn other_lines_and_namespaces_are_no_objects() {
        for line in [
            "Creating objects in the target cluster",
            "Creating target namespaces, if missing",
            r#"Creating Namespace="team-b""#,
            "Creating",
            r#"Creating ="x""#,
        ] {
            assert_eq!(parse(line), Would::default(), "{line}");
        }
    }
}
