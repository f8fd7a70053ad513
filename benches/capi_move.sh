#!/usr/bin/env bash
# benches/capi_move.sh [CLUSTERS] - `handoff move` against plain `clusterctl move` on the real
# Cluster API (../shared/capi: real clusterctl, core, kubeadm bootstrap and control-plane, CAPD
# in-memory managers, shipped manifests and leader-election settings), with CLUSTERS workload
# clusters (default 1; BENCHMARKS.md has 1 and 10) in one namespace:
#   1. two management clusters (up.sh), handoff registered on both (the local overlay);
#   2. CLUSTERS workload clusters in namespace `many` of the source, and as many in `plain`;
#   3. `clusterctl move -n plain`, timed; then `handoff move -n many`, timed, its memory (max RSS)
#      and every API request it made (kube's debug log: method and path, counted);
#   4. what each cluster's summary line says, and the move's own phases.
# MODE=directory does a backup and a restore instead of step 3: `clusterctl move -n plain
# --to-directory`, then `handoff move -n many --to-directory`, each timed; then each folder
# restored into the second management cluster, plain first (`--from-directory`), each timed.
# MODE=whole moves a whole management cluster instead, plain clusterctl namespace by namespace
# against `handoff move -A` and one `handoff move` per namespace, RUNS (default 3) times each,
# with nothing of handoff installed (benches/capi_whole.sh). MODE=paths moves one namespace back
# and forth the two ways a single-namespace move could take, stop-first (`handoff move -n`) and
# pause-first (`handoff move -A` on a source holding only that namespace), RUNS times each
# (benches/capi_paths.sh).
# Everything runs in a network namespace of its own and is stopped at the end (KEEP=1 keeps it).
# Needs root, kubectl, python3 with PyYAML, iproute2, util-linux, xz-utils, openssl; cargo build
# first (target/debug/handoff). Prints a summary line per figure; the full logs stay in $W.
set -uo pipefail
if [[ -z ${HANDOFF_BENCH_NETNS:-} ]]; then exec env HANDOFF_BENCH_NETNS=1 unshare -n "$0" "$@"; fi
ip link set lo up
HERE=$(cd "$(dirname "$0")/.." && pwd)
S=$(cd "$HERE/../shared/capi" && pwd)
export CAPI_ROOT=${CAPI_ROOT:-$("$S/unpack.sh")}
export CLUSTERCTL_DISABLE_VERSIONCHECK=true XDG_CONFIG_HOME=$CAPI_ROOT/xdg TZ=UTC
H=${HANDOFF:-$HERE/target/debug/handoff}
N=${1:-1}
W=${W:-$(mktemp -d /tmp/handoff-capi-bench.XXXXXX)}
mkdir -p "$W"
say() { echo "[bench +$SECONDS s] $*"; }
now() { date +%s.%N; }
server() { kubectl --kubeconfig "$1" config view --minify -o jsonpath='{.clusters[0].cluster.server}'; }
since() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }
cleanup() {
  [[ -n ${KEEP:-} ]] && { say "KEEP=1: nsenter -t $$ -n; kill $$ to stop"; sleep infinity; }
  kill $(jobs -p) 2>/dev/null
  "$S/down.sh" "$W/src" >/dev/null 2>&1; "$S/down.sh" "$W/dst" >/dev/null 2>&1
}
trap cleanup EXIT

[[ ${MODE:-move} == whole ]] && export FEATURE_GATES=ClusterTopology=true
"$S/up.sh" "$W/src" src >"$W/src.kc" 2>"$W/up-src.log" & a=$!
"$S/up.sh" "$W/dst" dst >"$W/dst.kc" 2>"$W/up-dst.log" & b=$!
wait $a && wait $b || { cat "$W"/up-*.log; exit 1; }
SRC=$(cat "$W/src.kc") DST=$(cat "$W/dst.kc")
say "two management clusters up"

if [[ ${MODE:-move} != whole && ${MODE:-move} != paths ]]; then
cp -r "$HERE/manifests" "$W/manifests"
"$H" certs --out "$W/manifests/overlays/local/certs" --ip 127.0.0.1 --dns localhost >/dev/null
port=18443
for kc in "$SRC" "$DST"; do
  port=$((port + 1))
  "$H" serve --listen 127.0.0.1:$port --metrics-listen 127.0.0.1:$((port + 100)) --kubeconfig "$kc" \
    --tls-cert "$W/manifests/overlays/local/certs/tls.crt" --tls-key "$W/manifests/overlays/local/certs/tls.key" \
    >"$W/serve-$port.log" 2>&1 &
  kubectl kustomize "$W/manifests/overlays/local" | sed "s#https://127.0.0.1:8443/#https://127.0.0.1:$port/#" |
    kubectl --kubeconfig "$kc" apply -f - >/dev/null
done

pids=()
# The namespaces first: workload.sh creates its own, and ten at once race to.
kubectl --kubeconfig "$SRC" create namespace many >/dev/null
kubectl --kubeconfig "$SRC" create namespace plain >/dev/null
for ns in many plain; do
  for i in $(seq 1 "$N"); do
    "$S/workload.sh" "$SRC" $ns wl$i 1 >"$W/workload-$ns-$i.log" 2>&1 & pids+=($!)
  done
done
for p in "${pids[@]}"; do wait "$p" || { tail -n 5 "$W"/workload-*.log; exit 1; }; done
say "$N workload clusters in each of namespaces many and plain"
fi

# `handoff move ARGS…` with kube's debug log (every request) into $W/handoff-move.log, timed
# into $took; its memory and its clusterctl's (max RSS) at the end of the log.
handoff_move() {
  local t rc
  t=$(now)
  RUST_LOG=info,kube_client=debug python3 - "$H" move "$@" --clusterctl "$CAPI_ROOT/bin/clusterctl" \
    >"$W/handoff-move.log" 2>&1 <<'EOF'
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print(f"max RSS of handoff move and clusterctl: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} KiB", file=sys.stderr)
sys.exit(rc)
EOF
  rc=$?
  took=$(since "$t")
  ((rc == 0)) || { tail -40 "$W/handoff-move.log"; exit 1; }
}
# Plain `clusterctl move ARGS…`, timed into $plain.
plain_move() {
  local t out
  t=$(now)
  out=$("$CAPI_ROOT/bin/clusterctl" move "$@" 2>&1) || { echo "$out"; exit 1; }
  plain=$(since "$t")
}

# Every request handoff made, from its log $1 (kube_client's "requesting" event, inside its
# HTTP span), counted per method and path into $2, and the most frequent said.
requests() {
  grep 'requesting' "$1" | sed -E 's/.*http.method=([A-Z]+) http.url=([^ ]+).*/\1 \2/' |
    sed -E "s#$(server "$SRC")#src #; s#$(server "$DST")#dst #" |
    sed -E 's#\?.*##; s#/namespaces/[^/]+/#/namespaces/NS/#; s#(/[a-z0-9.-]+s)/[a-z0-9.-]+(/status)?$#\1/NAME\2#' |
    sort | uniq -c | sort -rn >"$2"
  say "handoff's API requests: $(awk '{s+=$1} END {print s}' "$2") in all; the most frequent:"
  head -15 "$2" | sed 's/^/  /'
}

# Whether Cluster NS/NAME is provisioned in $1: what clusterctl requires before a move and what
# "managed again" means after one.
provisioned() {
  kubectl --kubeconfig "$1" get -n "${2%/*}" clusters.cluster.x-k8s.io "${2#*/}" -o json 2>/dev/null |
    python3 -c '
import json, sys
c = json.load(sys.stdin); s = c.get("status", {}); i = s.get("initialization", {})
ok = {x["type"]: x["status"] == "True" for x in s.get("conditions", [])}
sys.exit(0 if not c["spec"].get("paused") and i.get("infrastructureProvisioned") and i.get("controlPlaneInitialized") and ok.get("Available") else 1)' &&
    [[ $(kubectl --kubeconfig "$1" get -n "${2%/*}" machines.cluster.x-k8s.io -l "cluster.x-k8s.io/cluster-name=${2#*/}" \
      -o jsonpath='{range .items[*]}{.status.nodeRef.name}{"\n"}{end}' | grep -c .) -ge 2 ]]
}
# Seconds until every Cluster of CLUSTERS (NS/NAME) is provisioned in $1. After a plain move, a
# Cluster whose in-memory API server the target's CAPD set up while the source's CAPD still
# served it (both run in one network namespace here) is never reached again until the target's
# CAPD restarts: with $2 set, its pods are deleted once 120 s have passed, as a user would, and
# it is said.
until_provisioned() {
  local t=$(now) c kicked=
  for c in "${CLUSTERS[@]}"; do
    until provisioned "$1" "$c"; do
      local s=$(printf '%.0f' "$(since "$t")")
      ((s < 900)) || { echo "$c not provisioned in $1" >&2; exit 1; }
      if [[ -n ${2:-} && -z $kicked ]] && ((s >= 120)); then
        kubectl --kubeconfig "$1" delete pod -n capd-system --all --wait=false >/dev/null
        kicked=1
        echo "[bench] $c not managed again after 120 s: the target's CAPD pod deleted" >&2
      fi
      sleep 1
    done
  done
  since "$t"
}
if [[ ${MODE:-move} == paths ]]; then
  # shellcheck source=benches/capi_paths.sh
  source "$HERE/benches/capi_paths.sh"
fi
if [[ ${MODE:-move} == whole ]]; then
  # shellcheck source=benches/capi_whole.sh
  source "$HERE/benches/capi_whole.sh"
fi

if [[ ${MODE:-move} == directory ]]; then
  mkdir -p "$W/plain" "$W/many"
  plain_move --kubeconfig "$SRC" -n plain --to-directory "$W/plain"
  say "plain clusterctl backup of $N clusters: ${plain}s ($(ls "$W/plain" | wc -l) files)"
  handoff_move --kubeconfig "$SRC" -n many --to-directory "$W/many"
  say "handoff move backup of $N clusters: ${took}s ($(ls "$W/many" | wc -l) files)"
  grep -E "proven stopped in|clusterctl exited|leads again|backup done|max RSS" "$W/handoff-move.log" | sed 's/^/  /'
  mv "$W/handoff-move.log" "$W/handoff-backup.log"
  requests "$W/handoff-backup.log" "$W/requests-backup.txt"
  plain_move --to-kubeconfig "$DST" --from-directory "$W/plain"
  say "plain clusterctl restore of $N clusters: ${plain}s"
  handoff_move --to-kubeconfig "$DST" --from-directory "$W/many"
  say "handoff move restore of $N clusters: ${took}s"
  grep -E "proven stopped in|clusterctl exited|leads again|restore done|max RSS" "$W/handoff-move.log" | sed 's/^/  /'
  mv "$W/handoff-move.log" "$W/handoff-restore.log"
  requests "$W/handoff-restore.log" "$W/requests-restore.txt"
  say "logs in $W"
  exit 0
fi

plain_move --kubeconfig "$SRC" --to-kubeconfig "$DST" -n plain
say "plain clusterctl move of $N clusters: ${plain}s"

handoff_move --kubeconfig "$SRC" --to-kubeconfig "$DST" -n many
say "handoff move of $N clusters: ${took}s"
grep -E "moved in|were stopped for|max RSS" "$W/handoff-move.log" | sed 's/^/  /'
requests "$W/handoff-move.log" "$W/requests.txt"
say "logs in $W"
