# MODE=paths of benches/capi_move.sh (sourced by it, after the two management clusters are up):
# which path a single-namespace move should take (issue 52). Namespace `one` holds a
# KubeadmControlPlane Cluster; it is moved back and forth between the two clusters, RUNS
# (default 3) times each way, alternating:
#   stop-first   `handoff move -n one`: both clusters stopped, then clusterctl pauses the
#                namespace's Clusters and honours any block-move itself (its back-off);
#   pause-first  `handoff move -A` on a source that holds only `one`: every Cluster paused with
#                the controllers running, the block-moves waited for, both clusters stopped at
#                once, unpaused, then clusterctl.
# Each figure: the move's seconds, the stop's own (from handoff's log), then the seconds until
# the Cluster is provisioned by the cluster it moved to. Nothing of handoff is installed.

CLUSTERS=(one/c1)
"$S/workload.sh" "$SRC" one c1 1 >"$W/workload-one.log" 2>&1 || { tail -n 5 "$W/workload-one.log"; exit 1; }
ready=$(until_provisioned "$SRC") || exit 1
say "provisioned in the source after ${ready}s more: ${CLUSTERS[*]}"

from=$SRC to=$DST
for run in $(seq 1 "${RUNS:-3}"); do
  # Each path goes each way: the order turns from run to run, as the direction does per move.
  order=(stop-first pause-first)
  ((run % 2 == 0)) && order=(pause-first stop-first)
  for how in "${order[@]}"; do
    case $how in
    stop-first) handoff_move --kubeconfig "$from" --to-kubeconfig "$to" -n one ;;
    pause-first) handoff_move --kubeconfig "$from" --to-kubeconfig "$to" --all-namespaces ;;
    esac
    cat "$W/handoff-move.log" >>"$W/$how.log"
    managed=$(until_provisioned "$to") || exit 1
    say "run $run, $how: moved in ${took}s; provisioned by the target ${managed}s later"
    grep -E "moved in|were stopped for|proven stopped in" "$W/handoff-move.log" | sed 's/^/  /'
    read -r from to <<<"$to $from"
  done
done
say "logs in $W"
exit 0
