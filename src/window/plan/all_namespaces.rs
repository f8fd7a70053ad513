//! A whole management cluster's move decided before anything is written: which namespaces of
//! the source hold something clusterctl moves, and the order clusterctl moves them in. No I/O.
//!
//! clusterctl moves one namespace a run: the CLI and `client.Move` turn an empty namespace into
//! the kubeconfig context's (`cmd/clusterctl/client/move.go`). A topology Cluster's
//! ClusterClass may live in another namespace; clusterctl copies the class with the Cluster
//! and leaves it in the source (`cmd/clusterctl/client/cluster/objectgraph.go`, `Discovery`
//! and `setShouldNotDelete`). So every namespace whose Clusters use a class of another is moved
//! before the class's own namespace, whose run then takes the class out of the source. Classes
//! used in a circle (a Cluster of `a` on a class of `b`, one of `b` on a class of `a`) have no
//! such order: whichever namespace goes first leaves its classes behind in the source for good,
//! so the plan refuses them by name.

use std::collections::{BTreeMap, BTreeSet};

use crate::window::plan::move_plan::{ClusterSeen, namespace_of};

/// What one namespace of the source holds that clusterctl moves, as `namespace/name` keys
/// (`others`: `Kind namespace/name` of the labelled kinds' objects, beside Clusters and
/// ClusterClasses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub clusters: Vec<String>,
    pub classes: Vec<String>,
    pub others: Vec<String>,
}

/// Why a whole management cluster's move does not start: kept typed to the command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllRefusal {
    #[error(
        "no namespace of the source holds a Cluster, a ClusterClass or an object of a kind clusterctl moves: nothing to move"
    )]
    Nothing,
    #[error(
        "the ClusterClasses of namespaces {} are used by each other's Clusters in a circle ({}): clusterctl leaves a class in the source while a Cluster of another namespace uses it, so whichever namespace moved first would leave its classes behind; move one class into the namespace of the Clusters that use it, or move these namespaces with `handoff move -n` one at a time",
        .namespaces.join(", "),
        .uses.join("; ")
    )]
    ClassesInACircle {
        namespaces: Vec<String>,
        /// `team-a/wl1 uses ClusterClass classes/quick-start`, for each use in the circle.
        uses: Vec<String>,
    },
}

/// Every namespace that holds a Cluster, a ClusterClass or one of `others` (`(namespace,
/// "Kind namespace/name")`; a cluster-scoped one, namespace `""`, is no namespace's), sorted by
/// name, each one's keys sorted.
pub fn namespaces(
    every_cluster: &[ClusterSeen],
    every_class: &[ClusterSeen],
    others: &[(String, String)],
) -> Vec<Namespace> {
    let mut by: BTreeMap<String, Namespace> = BTreeMap::new();
    for c in every_cluster {
        entry(&mut by, namespace_of(&c.key))
            .clusters
            .push(c.key.clone());
    }
    for c in every_class {
        entry(&mut by, namespace_of(&c.key))
            .classes
            .push(c.key.clone());
    }
    // A cluster-scoped object belongs to no namespace: every one's move copies it.
    for (ns, what) in others.iter().filter(|(ns, _)| !ns.is_empty()) {
        entry(&mut by, ns).others.push(what.clone());
    }
    by.into_values()
        .map(|mut n| {
            n.clusters.sort();
            n.classes.sort();
            n.others.sort();
            n
        })
        .collect()
}

fn entry<'a>(by: &'a mut BTreeMap<String, Namespace>, ns: &str) -> &'a mut Namespace {
    by.entry(ns.to_string()).or_insert_with(|| Namespace {
        name: ns.to_string(),
        ..Namespace::default()
    })
}

/// The order clusterctl moves `namespaces` in: each namespace before those whose ClusterClasses
/// its Clusters use, and otherwise by name. A class of a namespace the move does not take (the
/// class is missing from the source) orders nothing: clusterctl says what it misses.
pub fn order(
    namespaces: &[Namespace],
    every_cluster: &[ClusterSeen],
) -> Result<Vec<String>, AllRefusal> {
    if namespaces.is_empty() {
        return Err(AllRefusal::Nothing);
    }
    let taken: BTreeSet<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    // user's namespace → the class namespaces it must come before, and how many come first.
    let mut before: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut waits_for: BTreeMap<&str, usize> = taken.iter().map(|n| (*n, 0)).collect();
    for c in every_cluster {
        let user = namespace_of(&c.key);
        let Some(class_ns) = c.class.as_deref().map(namespace_of) else {
            continue;
        };
        if user == class_ns || !taken.contains(user) || !taken.contains(class_ns) {
            continue;
        }
        if before.entry(user).or_default().insert(class_ns) {
            *waits_for.get_mut(class_ns).expect("taken") += 1;
        }
    }
    let mut ready: BTreeSet<&str> = waits_for
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(ns, _)| *ns)
        .collect();
    let mut out = Vec::with_capacity(taken.len());
    while let Some(ns) = ready.pop_first() {
        out.push(ns.to_string());
        for class_ns in before.get(ns).into_iter().flatten() {
            let n = waits_for.get_mut(class_ns).expect("taken");
            *n -= 1;
            if *n == 0 {
                ready.insert(class_ns);
            }
        }
    }
    if out.len() == taken.len() {
        return Ok(out);
    }
    let left: BTreeSet<&str> = waits_for
        .iter()
        .filter(|(ns, _)| !out.iter().any(|o| o == *ns))
        .map(|(ns, _)| *ns)
        .collect();
    let uses = every_cluster
        .iter()
        .filter_map(|c| {
            let class = c.class.as_deref()?;
            let (user, class_ns) = (namespace_of(&c.key), namespace_of(class));
            (user != class_ns && left.contains(user) && left.contains(class_ns))
                .then(|| format!("{} uses ClusterClass {class}", c.key))
        })
        .collect();
    Err(AllRefusal::ClassesInACircle {
        namespaces: left.into_iter().map(String::from).collect(),
        uses,
    })
}

/// What `handoff move --all-namespaces --dry-run` says: each namespace in clusterctl's order with
/// what it holds, or why the move would be refused; nothing is written.
/// `clusterctl`: what clusterctl's own dry run of each namespace left out (`left_behind`), or
/// why it failed; a namespace missing from it was not asked.
pub fn dry_run(
    namespaces: &[Namespace],
    every_cluster: &[ClusterSeen],
    every_class: &[ClusterSeen],
    others: &[(String, String)],
    clusterctl: &BTreeMap<String, Result<Vec<String>, String>>,
) -> String {
    let mut out = String::new();
    let paused: Vec<&str> = every_cluster
        .iter()
        .chain(every_class)
        .filter(|c| c.paused)
        .map(|c| c.key.as_str())
        .collect();
    let order = match order(namespaces, every_cluster) {
        Ok(order) => order,
        Err(e) => {
            return format!("handoff move -A would refuse: {e}\nDry run: nothing was written.\n");
        }
    };
    out.push_str(&format!(
        "handoff move -A would move {} namespace{} under one stop of both clusters, clusterctl once each, in this order:\n",
        order.len(),
        if order.len() == 1 { "" } else { "s" }
    ));
    for name in &order {
        let n = namespaces
            .iter()
            .find(|n| &n.name == name)
            .expect("ordered");
        let mut held = Vec::new();
        for key in &n.clusters {
            let class = every_cluster
                .iter()
                .find(|c| &c.key == key)
                .and_then(|c| c.class.as_deref())
                .map(|k| format!(" (ClusterClass {k})"))
                .unwrap_or_default();
            held.push(format!("Cluster {key}{class}"));
        }
        held.extend(n.classes.iter().map(|k| format!("ClusterClass {k}")));
        held.extend(n.others.iter().cloned());
        out.push_str(&format!("  {name}: {}\n", held.join(", ")));
        match clusterctl.get(name) {
            Some(Ok(left)) if !left.is_empty() => out.push_str(&format!(
                "    left in the source: clusterctl's dry run does not carry {} (no Cluster, ClusterClass or labelled root reaches it)\n",
                left.join(", ")
            )),
            Some(Err(why)) => out.push_str(&format!("    clusterctl's dry run failed: {why}\n")),
            _ => {}
        }
    }
    let global: Vec<&str> = others
        .iter()
        .filter(|(ns, _)| ns.is_empty())
        .map(|(_, what)| what.as_str())
        .collect();
    if !global.is_empty() {
        out.push_str(&format!(
            "cluster-scoped, copied to the target with the first namespace and left in the source (clusterctl never deletes a cluster-scoped object: mover.go, deleteSourceObject): {}\n",
            global.join(", ")
        ));
    }
    if !paused.is_empty() {
        out.push_str(&format!(
            "handoff move -A would refuse: paused already, and not by handoff (clusterctl moves nothing paused): {}\n",
            paused.join(", ")
        ));
    }
    out.push_str("Dry run: nothing was written.\n");
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn cluster(key: &str, class: Option<&str>) -> ClusterSeen {
        ClusterSeen {
            key: key.into(),
            class: class.map(String::from),
            ..ClusterSeen::default()
        }
    }

    pub(crate) fn class(key: &str) -> ClusterSeen {
        ClusterSeen {
            key: key.into(),
            ..ClusterSeen::default()
        }
    }

    /// The shape issue 52 measures: a class namespace of its own, two teams on its class, a
    /// KubeadmControlPlane Cluster without a class in a fourth.
    fn management_cluster() -> (Vec<ClusterSeen>, Vec<ClusterSeen>) {
        (
            vec![
                cluster("team-b/wl2", Some("classes/quick-start")),
                cluster("team-a/wl1", Some("classes/quick-start")),
                cluster("kcp/wl3", None),
            ],
            vec![class("classes/quick-start")],
        )
    }

    #[test]
    fn every_namespace_with_something_to_move_once_sorted() {
        let (clusters, classes) = management_cluster();
        let others = [(
            "infra".to_string(),
            "DevClusterIdentity infra/shared".to_string(),
        )];
        let ns = namespaces(&clusters, &classes, &others);
        let names: Vec<&str> = ns.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["classes", "infra", "kcp", "team-a", "team-b"]);
        assert_eq!(ns[0].classes, ["classes/quick-start"]);
        assert!(ns[0].clusters.is_empty());
        assert_eq!(ns[1].others, ["DevClusterIdentity infra/shared"]);
        assert_eq!(ns[3].clusters, ["team-a/wl1"]);
    }

    #[test]
    fn a_class_namespace_moves_after_every_namespace_that_uses_its_classes() {
        let (clusters, classes) = management_cluster();
        let ns = namespaces(&clusters, &classes, &[]);
        assert_eq!(
            order(&ns, &clusters).unwrap(),
            ["kcp", "team-a", "team-b", "classes"]
        );
    }

    #[test]
    fn a_chain_of_classes_is_ordered_through() {
        // team-a uses a class of platform, platform's own Cluster a class of base.
        let clusters = vec![
            cluster("team-a/wl1", Some("platform/app")),
            cluster("platform/mgmt", Some("base/core")),
        ];
        let classes = vec![class("platform/app"), class("base/core")];
        let ns = namespaces(&clusters, &classes, &[]);
        assert_eq!(
            order(&ns, &clusters).unwrap(),
            ["team-a", "platform", "base"]
        );
    }

    #[test]
    fn a_class_of_the_clusters_own_namespace_or_missing_orders_nothing() {
        let clusters = vec![
            cluster("b/wl1", Some("b/own")),
            cluster("a/wl2", Some("gone/class")),
        ];
        let classes = vec![class("b/own")];
        let ns = namespaces(&clusters, &classes, &[]);
        assert_eq!(order(&ns, &clusters).unwrap(), ["a", "b"]);
    }

    #[test]
    fn classes_used_in_a_circle_are_refused_by_name() {
        let clusters = vec![
            cluster("a/wl1", Some("b/cb")),
            cluster("b/wl2", Some("a/ca")),
            cluster("c/wl3", None),
        ];
        let classes = vec![class("a/ca"), class("b/cb")];
        let ns = namespaces(&clusters, &classes, &[]);
        let e = order(&ns, &clusters).unwrap_err();
        assert_eq!(
            e,
            AllRefusal::ClassesInACircle {
                namespaces: vec!["a".into(), "b".into()],
                uses: vec![
                    "a/wl1 uses ClusterClass b/cb".into(),
                    "b/wl2 uses ClusterClass a/ca".into()
                ],
            }
        );
        let said = e.to_string();
        assert!(said.contains("namespaces a, b"), "{said}");
        assert!(said.contains("handoff move -n"), "{said}");
    }

    #[test]
    fn the_dry_run_says_each_namespace_in_order_and_what_would_refuse() {
        let (mut clusters, classes) = management_cluster();
        let others = [
            (
                "infra".to_string(),
                "DevClusterIdentity infra/shared".to_string(),
            ),
            (String::new(), "SiteIdentity site-1".to_string()),
        ];
        let ns = namespaces(&clusters, &classes, &others);
        assert_eq!(ns.len(), 5, "a cluster-scoped object is no namespace's");
        let mut said_by = BTreeMap::new();
        said_by.insert(
            "kcp".to_string(),
            Ok(vec!["IPAddressClaim kcp/orphan".to_string()]),
        );
        said_by.insert("team-a".to_string(), Ok(vec![]));
        said_by.insert(
            "team-b".to_string(),
            Err("exit code 1: no route to host".to_string()),
        );
        let said = dry_run(&ns, &clusters, &classes, &others, &said_by);
        assert_eq!(
            said,
            "handoff move -A would move 5 namespaces under one stop of both clusters, clusterctl once each, in this order:\n  \
             infra: DevClusterIdentity infra/shared\n  \
             kcp: Cluster kcp/wl3\n    \
             left in the source: clusterctl's dry run does not carry IPAddressClaim kcp/orphan (no Cluster, ClusterClass or labelled root reaches it)\n  \
             team-a: Cluster team-a/wl1 (ClusterClass classes/quick-start)\n  \
             team-b: Cluster team-b/wl2 (ClusterClass classes/quick-start)\n    \
             clusterctl's dry run failed: exit code 1: no route to host\n  \
             classes: ClusterClass classes/quick-start\n\
             cluster-scoped, copied to the target with the first namespace and left in the source (clusterctl never deletes a cluster-scoped object: mover.go, deleteSourceObject): SiteIdentity site-1\n\
             Dry run: nothing was written.\n"
        );
        clusters[2].paused = true;
        let said = dry_run(&ns, &clusters, &classes, &[], &BTreeMap::new());
        assert!(said.contains("would refuse: paused already, and not by handoff (clusterctl moves nothing paused): kcp/wl3"), "{said}");
        clusters.push(cluster("classes/x", Some("team-a/own")));
        let classes = [classes, vec![class("team-a/own")]].concat();
        let ns = namespaces(&clusters, &classes, &[]);
        assert!(
            dry_run(&ns, &clusters, &classes, &[], &BTreeMap::new()).starts_with(
                "handoff move -A would refuse: the ClusterClasses of namespaces classes, team-a"
            )
        );
    }

    #[test]
    fn nothing_to_move_is_refused() {
        assert_eq!(order(&[], &[]), Err(AllRefusal::Nothing));
    }
}
