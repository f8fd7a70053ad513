# MODE=whole of benches/capi_move.sh (sourced by it, after the two management clusters are up
# with ClusterTopology on): a whole management cluster moved three ways, RUNS times each, back
# and forth between the two clusters (issue 52):
#   plain     `clusterctl move` namespace by namespace in the order a user has to find (each
#             shared ClusterClass's users first, the class unpaused by hand after each, as
#             clusterctl leaves it paused in the source), then the source's CAPD pod deleted as
#             handoff's proof deletes it;
#   whole     `handoff move --all-namespaces`;
#   each      one `handoff move -n` per namespace, in the same order.
# The shape: ClusterClass `quick` in `classes`, topology Clusters of it in team-a and team-b, a
# KubeadmControlPlane Cluster without a class in `legacy`, a cluster-scoped SiteIdentity of a
# test CRD labelled for the move hierarchy. Each figure: the move's seconds, then the seconds
# until every moved Cluster is provisioned (Available, every Machine with a nodeRef) by the
# cluster it moved to.

ORDER=(team-a team-b legacy classes)
CLUSTERS=(team-a/a1 team-b/b1 legacy/l1)

for kc in "$SRC" "$DST"; do
  kubectl --kubeconfig "$kc" apply -f - >/dev/null <<'Y'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: siteidentities.identity.handoff.test
  labels: {clusterctl.cluster.x-k8s.io: "", clusterctl.cluster.x-k8s.io/move-hierarchy: ""}
spec:
  group: identity.handoff.test
  scope: Cluster
  names: {plural: siteidentities, singular: siteidentity, kind: SiteIdentity}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
Y
done
kubectl --kubeconfig "$SRC" wait --for=condition=Established crd/siteidentities.identity.handoff.test >/dev/null
echo 'apiVersion: identity.handoff.test/v1
kind: SiteIdentity
metadata: {name: site-1}' | kubectl --kubeconfig "$SRC" apply -f - >/dev/null
"$S/workload.sh" "$SRC" legacy l1 1 >"$W/workload-legacy.log" 2>&1 & legacy=$!
"$S/clusterclass.sh" class "$SRC" classes quick >/dev/null
for t in team-a/a1 team-b/b1; do
  "$S/clusterclass.sh" topology "$SRC" "${t%/*}" "${t#*/}" classes quick >/dev/null
done

# What kube-controller-manager's garbage collector would do for a topology Cluster, which
# envtest does not run (tests/capi/classes.rs, collect_garbage): the topology controller's
# `<cluster>-shim` Secret deleted and the references to it dropped, without which clusterctl
# leaves the DevCluster and the KubeadmControlPlane in the source.
collect_garbage() {
  local kc=$1 ns=$2 name=$3 o
  until [[ $(kubectl --kubeconfig "$kc" get -n "$ns" devclusters,kubeadmcontrolplanes -o json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
print(len(items) == 2 and all(any(r["kind"] == "Cluster" for r in i["metadata"].get("ownerReferences", [])) for i in items))') == True ]]; do
    sleep 1
  done
  kubectl --kubeconfig "$kc" delete -n "$ns" secret "$name-shim" --ignore-not-found --wait=false >/dev/null
  for o in $(kubectl --kubeconfig "$kc" get -n "$ns" devclusters,kubeadmcontrolplanes -o name); do
    kubectl --kubeconfig "$kc" get -n "$ns" "$o" -o json | python3 -c '
import json, sys
o = json.load(sys.stdin)
print(json.dumps({"metadata": {"ownerReferences": [r for r in o["metadata"].get("ownerReferences", []) if r["kind"] != "Secret"]}}))' |
      xargs -0 kubectl --kubeconfig "$kc" patch -n "$ns" "$o" --type merge -p >/dev/null
  done
}
for t in team-a/a1 team-b/b1; do collect_garbage "$SRC" "${t%/*}" "${t#*/}"; done
wait $legacy || { tail -n 5 "$W/workload-legacy.log"; exit 1; }
ready=$(until_provisioned "$SRC") || exit 1
say "provisioned in the source after ${ready}s more: ${CLUSTERS[*]}, ClusterClass classes/quick, SiteIdentity site-1"

# One way of moving everything from $2 to $3 ($1: plain, whole, each): its seconds into $took.
move_all() {
  local how=$1 from=$2 to=$3 t ns
  t=$(now)
  case $how in
  plain)
    for ns in "${ORDER[@]}"; do
      local t1=$(now)
      "$CAPI_ROOT/bin/clusterctl" move --kubeconfig "$from" --to-kubeconfig "$to" -n "$ns" >>"$W/plain.log" 2>&1 ||
        { tail -20 "$W/plain.log"; exit 1; }
      echo "clusterctl move -n $ns: $(since "$t1")s" >>"$W/plain.log"
      # clusterctl leaves a ClusterClass of another namespace paused in the source, and refuses
      # the next namespace that uses it: the user unpauses it.
      kubectl --kubeconfig "$from" annotate -n classes clusterclasses.cluster.x-k8s.io quick cluster.x-k8s.io/paused- \
        >/dev/null 2>&1 || true
    done
    # handoff's proof deletes the source's former leaders; do the same to CAPD, whose in-memory
    # workload clusters live in its process, so that both are measured alike.
    kubectl --kubeconfig "$from" delete pod -n capd-system --all --wait=false >/dev/null
    ;;
  whole)
    handoff_move --kubeconfig "$from" --to-kubeconfig "$to" -A
    cat "$W/handoff-move.log" >>"$W/whole.log"
    ;;
  each)
    for ns in "${ORDER[@]}"; do
      handoff_move --kubeconfig "$from" --to-kubeconfig "$to" -n "$ns"
      cat "$W/handoff-move.log" >>"$W/each.log"
    done
    ;;
  esac
  took=$(since "$t")
}

from=$SRC to=$DST
for run in $(seq 1 "${RUNS:-3}"); do
  for how in plain whole each; do
    move_all "$how" "$from" "$to"
    managed=$(until_provisioned "$to" "$([[ $how == plain ]] && echo kick)") || exit 1
    say "run $run, $how: moved in ${took}s; every Cluster provisioned by the target ${managed}s later"
    left=$(kubectl --kubeconfig "$from" get clusters.cluster.x-k8s.io,clusterclasses.cluster.x-k8s.io -A -o name | wc -l)
    ((left == 0)) || { echo "$left Clusters or ClusterClasses left in the source" >&2; exit 1; }
    read -r from to <<<"$to $from"
  done
done
say "logs in $W"
exit 0
