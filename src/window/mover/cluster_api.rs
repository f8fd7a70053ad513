//! What `handoff move` reads and writes of Cluster API's own objects in the namespace it
//! moves: Clusters, ClusterClasses, and the objects clusterctl moves (their block-move and
//! delete marks).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};

use serde_json::json;

use crate::window::cluster::{Cluster, Result, api_err};
use crate::window::plan::move_plan::{
    self, BLOCK_MOVE, ClusterSeen, PAUSED_ANNOTATION, Scope, is_handoffs, namespace_of,
};

pub const CLUSTERS: &str = "clusters.cluster.x-k8s.io";
pub const CLUSTER_CLASSES: &str = "clusterclasses.cluster.x-k8s.io";
/// clusterctl marks each object with it before deleting it from the source
/// (`clusterctlv1.DeleteForMoveAnnotation`).
pub const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

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

pub async fn resource(c: &Cluster, crd: &str) -> Result<Option<ApiResource>> {
    if let Some(known) = c.crd_known(crd) {
        return Ok(known);
    }
    let ar = Api::<CustomResourceDefinition>::all(c.client.clone())
        .get_opt(crd)
        .await
        .map_err(api_err(
            c,
            format!("reading CustomResourceDefinition {crd}"),
        ))?
        .as_ref()
        .and_then(api_resource);
    c.crd_read(crd, ar.clone());
    Ok(ar)
}

/// Every object of `crd` in `ns` (none where the CRD is not installed): `spec.paused` or the
/// paused annotation, and its block-move.
pub async fn paused_in(c: &Cluster, ns: &str, crd: &str) -> Result<Vec<ClusterSeen>> {
    let Some(ar) = resource(c, crd).await? else {
        return Ok(vec![]);
    };
    let list = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, format!("listing {} in {ns}", ar.plural)))?;
    let mut out: Vec<ClusterSeen> = list.items.iter().map(|o| seen(o, ns)).collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// One object as `paused_in` reports it.
pub fn seen(o: &DynamicObject, ns: &str) -> ClusterSeen {
    let ann = o.metadata.annotations.as_ref();
    ClusterSeen {
        key: format!("{ns}/{}", o.metadata.name.clone().unwrap_or_default()),
        paused: o.data["spec"]["paused"].as_bool() == Some(true)
            || ann.is_some_and(|a| a.contains_key(PAUSED_ANNOTATION)),
        block_move: ann.and_then(|a| a.get(BLOCK_MOVE)).cloned(),
        class: class_of(&o.data, ns),
    }
}

/// A topology Cluster's ClusterClass, `namespace/name`: `spec.topology.classRef` (v1beta2),
/// or `spec.topology.class` and `classNamespace` (v1beta1), the namespace defaulting to the
/// Cluster's (`Cluster.GetClassKey`).
fn class_of(data: &serde_json::Value, ns: &str) -> Option<String> {
    let topology = &data["spec"]["topology"];
    let (name, class_ns) = match topology["classRef"]["name"].as_str() {
        Some(name) => (name, topology["classRef"]["namespace"].as_str()),
        None => (
            topology["class"].as_str()?,
            topology["classNamespace"].as_str(),
        ),
    };
    let class_ns = class_ns.filter(|n| !n.is_empty()).unwrap_or(ns);
    (!name.is_empty()).then(|| format!("{class_ns}/{name}"))
}

/// What a move of namespace `ns` reads of the source's Cluster API objects
/// (`move_plan::scope`), from every Cluster and every ClusterClass: two lists, whichever
/// namespaces the classes its Clusters use are in. `recorded`: the ClusterClasses an earlier
/// attempt recorded; `with_clusters`: false where only the classes are needed (their users and
/// the namespace's Clusters are then left out).
pub async fn scope(
    source: &Cluster,
    ns: &str,
    recorded: &[String],
    with_clusters: bool,
) -> Result<Scope> {
    let every = match with_clusters {
        true => every_cluster(source).await?,
        false => Vec::new(),
    };
    let classes = every_of(source, CLUSTER_CLASSES, "ClusterClasses").await?;
    Ok(move_plan::scope(ns, &every, classes, recorded))
}

pub async fn clusters_in(c: &Cluster, ns: &str) -> Result<Vec<ClusterSeen>> {
    paused_in(c, ns, CLUSTERS).await
}

/// Every Cluster of the cluster, in every namespace (as clusterctl lists them to find who
/// uses a ClusterClass of the namespace it moves, `setShouldNotDelete`).
pub async fn every_cluster(c: &Cluster) -> Result<Vec<ClusterSeen>> {
    every_of(c, CLUSTERS, "Clusters").await
}

/// Every ClusterClass of the cluster, in every namespace.
pub async fn every_class(c: &Cluster) -> Result<Vec<ClusterSeen>> {
    every_of(c, CLUSTER_CLASSES, "ClusterClasses").await
}

/// The objects clusterctl moves as roots of their own beside Clusters and ClusterClasses: those
/// of the CRDs it discovers (labelled `clusterctl.cluster.x-k8s.io`) that are labelled
/// `clusterctl.cluster.x-k8s.io/move-hierarchy` too (`objectgraph.go`, `getDiscoveryTypes`),
/// as `(namespace, "Kind namespace/name")`; a cluster-scoped one as `("", "Kind name")`: every
/// namespace's move copies it (its listing ignores the namespace) and none deletes it
/// (`mover.go`, `deleteSourceObject` skips global objects).
pub async fn move_hierarchy_roots(c: &Cluster) -> Result<Vec<(String, String)>> {
    let crds = Api::<CustomResourceDefinition>::all(c.client.clone())
        .list(
            &ListParams::default()
                .labels("clusterctl.cluster.x-k8s.io,clusterctl.cluster.x-k8s.io/move-hierarchy"),
        )
        .await
        .map_err(api_err(
            c,
            "listing the CustomResourceDefinitions labelled for clusterctl's move hierarchy",
        ))?;
    let mut out = Vec::new();
    for crd in &crds.items {
        let Some(ar) = api_resource(crd) else {
            continue;
        };
        let list = Api::<DynamicObject>::all_with(c.client.clone(), &ar)
            .list_metadata(&ListParams::default())
            .await
            .map_err(api_err(
                c,
                format!("listing the {} of every namespace", ar.plural),
            ))?;
        for o in list.items {
            let name = o.metadata.name.unwrap_or_default();
            let (ns, what) = match o.metadata.namespace {
                Some(ns) => (ns.clone(), format!("{} {ns}/{name}", ar.kind)),
                None => (String::new(), format!("{} {name}", ar.kind)),
            };
            out.push((ns, what));
        }
    }
    Ok(out)
}

/// Every object of a Cluster API kind, in every namespace (none where it is not installed).
async fn every_of(c: &Cluster, crd: &str, what: &str) -> Result<Vec<ClusterSeen>> {
    let Some(ar) = resource(c, crd).await? else {
        return Ok(vec![]);
    };
    let list = Api::<DynamicObject>::all_with(c.client.clone(), &ar)
        .list(&ListParams::default())
        .await
        .map_err(api_err(c, format!("listing the {what} of every namespace")))?;
    Ok(list
        .items
        .iter()
        .map(|o| seen(o, o.metadata.namespace.as_deref().unwrap_or_default()))
        .collect())
}

/// The ClusterClasses of `ns`, and those named in `elsewhere` (`namespace/name`, of other
/// namespaces; one that is gone is left out), sorted by key.
pub async fn classes_in(c: &Cluster, ns: &str, elsewhere: &[String]) -> Result<Vec<ClusterSeen>> {
    let mut out = paused_in(c, ns, CLUSTER_CLASSES).await?;
    if let Some(ar) = resource(c, CLUSTER_CLASSES).await? {
        for key in elsewhere.iter().filter(|k| namespace_of(k) != ns) {
            let (class_ns, name) = key.split_once('/').unwrap_or(("", key));
            let got = Api::<DynamicObject>::namespaced_with(c.client.clone(), class_ns, &ar)
                .get_opt(name)
                .await
                .map_err(api_err(c, format!("reading ClusterClass {key}")))?;
            out.extend(got.map(|o| seen(&o, class_ns)));
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out.dedup_by(|a, b| a.key == b.key);
    Ok(out)
}

/// What the other objects clusterctl moves say: which carry a block-move, which are marked for
/// deletion. They are the instances, in the namespace, of the CRDs labelled
/// `clusterctl.cluster.x-k8s.io`, as clusterctl's discovery selects them (`objectgraph.go`,
/// `getDiscoveryTypes`); the namespace's Secrets are `secrets_in`.
#[derive(Debug, Default)]
pub struct Scan {
    /// Every such object, as `Kind namespace/name`.
    pub objects: Vec<String>,
    pub blocking: Vec<String>,
    pub deleting: Vec<String>,
}

/// The namespaced kinds clusterctl moves: the CRDs labelled `clusterctl.cluster.x-k8s.io`, as
/// clusterctl's discovery selects them (`objectgraph.go`, `getDiscoveryTypes`).
async fn moved_kinds(c: &Cluster) -> Result<Vec<(CustomResourceDefinition, ApiResource)>> {
    let crds = Api::<CustomResourceDefinition>::all(c.client.clone())
        .list(&ListParams::default().labels("clusterctl.cluster.x-k8s.io"))
        .await
        .map_err(api_err(
            c,
            "listing the CustomResourceDefinitions clusterctl moves",
        ))?;
    Ok(crds
        .items
        .into_iter()
        .filter(|crd| crd.spec.scope == "Namespaced")
        .filter_map(|crd| {
            let ar = api_resource(&crd)?;
            Some((crd, ar))
        })
        .collect())
}

pub async fn scan(c: &Cluster, ns: &str) -> Result<Scan> {
    let mut out = Scan::default();
    for (crd, ar) in moved_kinds(c).await? {
        let list = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar)
            .list_metadata(&ListParams::default())
            .await
            .map_err(api_err(c, format!("listing {} in {ns}", ar.plural)))?;
        for o in list.items {
            let what = format!("{} {ns}/{}", ar.kind, o.metadata.name.unwrap_or_default());
            out.objects.push(what.clone());
            let ann = o.metadata.annotations.as_ref();
            if o.metadata.deletion_timestamp.is_some()
                || ann.is_some_and(|a| a.contains_key(DELETE_FOR_MOVE))
            {
                out.deleting.push(what.clone());
            }
            // Clusters' block-move is read with the Clusters; handoff's own (on a Cluster, or
            // on the ClusterClasses of a namespace that holds no Cluster) is no provider's.
            if crd.metadata.name.as_deref() != Some(CLUSTERS)
                && ann
                    .and_then(|a| a.get(BLOCK_MOVE))
                    .is_some_and(|v| !is_handoffs(v))
            {
                out.blocking.push(what);
            }
        }
    }
    out.objects.sort();
    out.blocking.sort();
    out.deleting.sort();
    Ok(out)
}

/// The namespace's Cluster API Secrets (labelled `cluster.x-k8s.io/cluster-name`), as `scan`
/// reports objects (every one, and those marked for deletion): clusterctl moves them too (a
/// Cluster's CA, kubeconfig, etcd, proxy and service-account keys, bootstrap data) and, as
/// leaves of its graph, deletes them from the source first. A CA deleted there and re-created
/// by the source's control plane would split the workload cluster's trust. Other Secrets (a
/// pull secret a GitOps tool put in the target) say nothing of the move. `None` where this user
/// may not list Secrets (the operator roles alone do not grant it).
pub async fn secrets_in(c: &Cluster, ns: &str) -> Result<Option<Scan>> {
    let listed = Api::<Secret>::namespaced(c.client.clone(), ns)
        .list_metadata(&ListParams::default().labels("cluster.x-k8s.io/cluster-name"))
        .await;
    let secrets = match listed {
        Ok(l) => l,
        Err(kube::Error::Api(e)) if e.code == 403 => return Ok(None),
        Err(e) => return Err(api_err(c, format!("listing secrets in {ns}"))(e)),
    };
    let mut out = Scan::default();
    for o in secrets.items {
        let what = format!("Secret {ns}/{}", o.metadata.name.unwrap_or_default());
        if o.metadata.deletion_timestamp.is_some()
            || o.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DELETE_FOR_MOVE))
        {
            out.deleting.push(what.clone());
        }
        out.objects.push(what);
    }
    Ok(Some(out))
}

/// Remove clusterctl's `delete-for-move` mark from every object of `ns` that carries it (the
/// moved kinds and the Cluster API Secrets): objects clusterctl marked and did not get to
/// delete before it died. clusterctl copies an object's annotations as they are
/// (`mover.go`, `createTargetObject`), so a re-run would create the mark in the target, where a
/// later delete would be taken for part of a move. Called only while the source's controllers
/// are stopped; clusterctl marks each object again right before it deletes it
/// (`deleteSourceObject`). What was unmarked, as `Kind namespace/name` (one already being
/// deleted keeps its mark), and whether the Secrets could be read (`false` where this user
/// may not list them).
pub async fn unmark_delete_for_move(c: &Cluster, ns: &str) -> Result<(Vec<String>, bool)> {
    let unmark = json!({"metadata": {"annotations": {DELETE_FOR_MOVE: null}}});
    // One being deleted keeps its mark: were its controllers to run before clusterctl removed
    // its finalizers, the mark is what tells them not to tear down what it stands for.
    let marked = |o: &kube::api::ObjectMeta| {
        o.deletion_timestamp.is_none()
            && o.annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DELETE_FOR_MOVE))
    };
    let mut out = Vec::new();
    for (_, ar) in moved_kinds(c).await? {
        let api = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar);
        let list = api
            .list_metadata(&ListParams::default())
            .await
            .map_err(api_err(c, format!("listing {} in {ns}", ar.plural)))?;
        for o in list.items.iter().filter(|o| marked(&o.metadata)) {
            let name = o.metadata.name.clone().unwrap_or_default();
            let what = format!("{} {ns}/{name}", ar.kind);
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&unmark))
                .await
            {
                Ok(_) => out.push(what),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(api_err(c, format!("unmarking {what}"))(e)),
            }
        }
    }
    let secrets = Api::<Secret>::namespaced(c.client.clone(), ns);
    let listed = match secrets
        .list_metadata(&ListParams::default().labels("cluster.x-k8s.io/cluster-name"))
        .await
    {
        Ok(l) => l,
        Err(kube::Error::Api(e)) if e.code == 403 => return Ok((out, false)),
        Err(e) => return Err(api_err(c, format!("listing secrets in {ns}"))(e)),
    };
    for o in listed.items.iter().filter(|o| marked(&o.metadata)) {
        let name = o.metadata.name.clone().unwrap_or_default();
        match secrets
            .patch(&name, &PatchParams::default(), &Patch::Merge(&unmark))
            .await
        {
            Ok(_) => out.push(format!("Secret {ns}/{name}")),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(api_err(c, format!("unmarking Secret {ns}/{name}"))(e)),
        }
    }
    Ok((out, true))
}

/// Merge-patch one object of `crd` (`namespace/name`); `false` when it is gone.
pub async fn patch(
    c: &Cluster,
    crd: &str,
    key: &str,
    patch: serde_json::Value,
    what: &str,
) -> Result<bool> {
    let Some(ar) = resource(c, crd).await? else {
        return Ok(false);
    };
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let api = Api::<DynamicObject>::namespaced_with(c.client.clone(), ns, &ar);
    let mut attempt = 1;
    loop {
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch.clone()))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            // A merge patch is the same patch again: retried while the provider's webhook
            // that validates it blinks (a replica going as its Lease is taken over).
            Err(kube::Error::Api(e)) if attempt < 5 && webhook_blinked(e.code, &e.message) => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(api_err(c, format!("{what} {} {key}", ar.kind))(e)),
        }
    }
}

/// Whether the API server refused a write only because a webhook it called was not there for
/// a moment (its connection ended or was refused), not because the webhook said no.
pub fn webhook_blinked(code: u16, message: &str) -> bool {
    code == 500
        && message.contains("failed calling webhook")
        && [
            "EOF",
            "connection refused",
            "connection reset",
            "no endpoints available",
        ]
        .iter()
        .any(|m| message.contains(m))
}

#[cfg(test)]
mod tests {
    use super::webhook_blinked;

    #[test]
    fn a_webhook_that_blinked_is_retried_and_one_that_said_no_is_not() {
        let eof = r#"Internal error occurred: failed calling webhook "validation.cluster.cluster.x-k8s.io": failed to call webhook: Post "https://capi-webhook-service.capi-system.svc:443/validate?timeout=10s": EOF"#;
        assert!(webhook_blinked(500, eof));
        assert!(webhook_blinked(
            500,
            r#"failed calling webhook "x": dial tcp 10.0.0.1:443: connect: connection refused"#
        ));
        assert!(!webhook_blinked(400, eof));
        assert!(!webhook_blinked(
            403,
            r#"admission webhook "validation.cluster.cluster.x-k8s.io" denied the request: spec.paused: Forbidden"#
        ));
        assert!(!webhook_blinked(
            500,
            r#"failed calling webhook "x": failed to call webhook: context deadline exceeded"#
        ));
    }
}
