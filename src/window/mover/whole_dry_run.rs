//! `handoff move --all-namespaces --dry-run`: each namespace in the order the move would take
//! them, what each holds, and what clusterctl's own dry run of each would not carry; nothing is
//! written (`all_namespaces::dry_run` renders it).

use std::collections::BTreeMap;

use super::MoveOptions;
use super::cluster_api::{every_class, every_cluster, move_hierarchy_roots, scan};
use crate::window::cluster::{Cluster, Result, WindowError};
use crate::window::plan::move_plan::{ClusterctlFlags, clusterctl_args};
use crate::window::plan::{all_namespaces, left_behind};
use crate::window::progress::Progress;

pub async fn dry_run(source: &Cluster, o: &MoveOptions, out: &mut Progress) -> Result<()> {
    let clusters = every_cluster(source).await?;
    let classes = every_class(source).await?;
    let roots = move_hierarchy_roots(source).await?;
    let ns = all_namespaces::namespaces(&clusters, &classes, &roots);
    let mut said = BTreeMap::new();
    // A move that would be refused is said so, without asking clusterctl about each namespace.
    if all_namespaces::order(&ns, &clusters).is_ok() {
        for n in &ns {
            said.insert(
                n.name.clone(),
                clusterctl_dry_run(source, o, &n.name).await?,
            );
        }
    }
    out.say(
        all_namespaces::dry_run(&ns, &clusters, &classes, &roots, &said)
            .trim_end()
            .to_string(),
    );
    Ok(())
}

/// clusterctl's own dry run of namespace `ns` (`-v 1`: every object it would create), against a
/// listing of the namespace's objects of the kinds it discovers: those it would not carry
/// (`left_behind`), or why it failed.
async fn clusterctl_dry_run(
    source: &Cluster,
    o: &MoveOptions,
    ns: &str,
) -> Result<std::result::Result<Vec<String>, String>> {
    let flags = ClusterctlFlags {
        namespace: ns.to_string(),
        dry_run: true,
        ..o.flags.clone()
    };
    let mut args = clusterctl_args(&flags);
    args.extend(["-v".into(), "1".into()]);
    let (ok, log) = crate::window::child::output(&o.clusterctl, args)
        .await
        .map_err(|e| WindowError::Refused {
            cluster: source.label.into(),
            message: e.to_string(),
        })?;
    if !ok {
        let last = log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Ok(Err(format!("clusterctl move --dry-run -n {ns}: {last}")));
    }
    let listed = scan(source, ns).await?.objects;
    let would = left_behind::parse(&log);
    Ok(Ok(left_behind::not_moved(&listed, &would)))
}
