#!/usr/bin/env bash
# Load test and memory measurement of `handoff serve` against a bare TLS floor.
#
#   benches/load.sh            # everything: throughput, latency at half load, memory
#   benches/load.sh load       # throughput and latency only
#   benches/load.sh memory     # benches/memory.py: located namespaces, API server and --state
#
# Env: DURATION (seconds per run, default 10), SERVER_CPU / CLIENT_CPU (default 0 / 1),
#      H1_CONNS (default 32), H2_CONNS x H2_STREAMS (default 4 x 16), LOW_RATE (default
#      1000 req/s), OUT (default target/bench). Traffic goes to 127.0.0.1 only; every run is bounded in time.
#
# What it does (method in BENCHMARKS.md):
#   1. builds `handoff` and `examples/floor.rs` in release, installs oha into target/bench-tools
#      if it is not on PATH;
#   2. writes a state folder of 10,000 namespaces (one held kcp namespace per 100 plain ones,
#      plus examples/state's MoveWindow and Deployments), a DELETE review whose object is
#      2 KiB, and a Deployment-update review (a recorded `kubectl apply`, 10.8 KB);
#   3. for HTTP/1.1 and h2, for both reviews: max throughput of the floor, then of handoff;
#      then p50/p99/p99.9 of each at half of the floor's max, at half of handoff's own max,
#      and at LOW_RATE (fixed rates, latency corrected for coordinated omission); the server
#      on SERVER_CPU, oha on CLIENT_CPU (taskset);
#   4. RSS (VmRSS, VmHWM) of `handoff serve --state` at 1k/10k/100k namespaces when ready and
#      after 10,000 requests;
#   5. prints a table with the ratio handoff/floor for each figure, and writes it with the
#      raw oha JSON under $OUT.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WHAT="${1:-all}"
DURATION="${DURATION:-10}"
SERVER_CPU="${SERVER_CPU:-0}"
CLIENT_CPU="${CLIENT_CPU:-1}"
H1_CONNS="${H1_CONNS:-32}"
H2_CONNS="${H2_CONNS:-4}"
H2_STREAMS="${H2_STREAMS:-16}"
LOW_RATE="${LOW_RATE:-1000}"
OUT="${OUT:-$ROOT/target/bench}"
FIXTURES="${HANDOFF_FIXTURES:-$ROOT/tests/fixtures}"
OHA_VERSION=1.16.0
FLOOR_PORT=9443
HANDOFF_PORT=8443

mkdir -p "$OUT/runs"
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# --- tools ------------------------------------------------------------------------------
export PATH="$ROOT/target/bench-tools/bin:$PATH"
if ! command -v oha >/dev/null; then
    log "installing oha $OHA_VERSION into target/bench-tools (once; a few minutes)"
    cargo install oha --locked --version "$OHA_VERSION" --root "$ROOT/target/bench-tools" >&2
fi
for tool in taskset curl python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
log "building handoff and the floor (release)"
# The paths cargo reports: right whatever CARGO_TARGET_DIR or build.target-dir say.
BUILT=$(cargo build --release --quiet --bin handoff --example floor --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])')
HANDOFF=$(awk '$1 == "handoff" {print $2}' <<<"$BUILT")
FLOOR=$(awk '$1 == "floor" {print $2}' <<<"$BUILT")
[ -x "$HANDOFF" ] && [ -x "$FLOOR" ] || { log "cargo did not report the handoff and floor executables"; exit 1; }

# --- inputs -----------------------------------------------------------------------------
"$HANDOFF" certs --out "$OUT/certs" --dns localhost --ip 127.0.0.1 >/dev/null 2>&1
CA="$OUT/certs/ca.crt"

# gen_state DIR N: N namespaces, one in 100 a kcp namespace held by its sync finalizer
# (the recorded kcp-33jbiactwhg0 first), plus the example MoveWindow and Deployments.
gen_state() {
    python3 - "$1" "$2" "$ROOT/examples/state" <<'PY'
import os, random, shutil, sys
out, n, examples = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(out, exist_ok=True)
key = "6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g"
loc = ('{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},'
       '"cluster":"root:org:ws","namespace":"%s"}')
rnd = random.Random(42)
alpha = "0123456789abcdefghijklmnopqrstuvwxyz"
with open(os.path.join(out, "namespaces.yaml"), "w") as f:
    for i in range(n):
        if i % 100 == 0:
            name = "kcp-33jbiactwhg0" if i == 0 else "kcp-" + "".join(rnd.choice(alpha) for _ in range(12))
            f.write(f"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"
                    f"  labels:\n    kubernetes.io/metadata.name: {name}\n"
                    f"  annotations:\n    finalizers.workload.kcp.io/{key}: glbc-migration\n"
                    f"    kcp.io/namespace-locator: '{loc % ('app-%d' % i)}'\n")
        else:
            name = f"team-{i:06d}"
            f.write(f"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"
                    f"  labels:\n    kubernetes.io/metadata.name: {name}\n    team: t{i % 37}\n")
for y in ("movewindows.yaml", "deployments.yaml"):
    shutil.copy(os.path.join(examples, y), os.path.join(out, y))
PY
}

# The recorded syncer DELETE, compact, its ConfigMap padded to exactly 2,048 bytes of JSON
# (as benches/micro.rs builds it); the recorded client-side apply of a CAPI Deployment.
python3 - "$FIXTURES" "$OUT" <<'PY'
import json, sys
fx, out = sys.argv[1], sys.argv[2]
compact = lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False)
r = json.load(open(f"{fx}/delete-configmap-by-syncer.json"))
old = r["request"]["oldObject"]
old["data"]["padding"] = ""
old["data"]["padding"] = "x" * (2048 - len(compact(old).encode()))
assert len(compact(old).encode()) == 2048
open(f"{out}/delete-2k.json", "w").write(compact(r))
u = json.load(open(f"{fx}/apply-deployment-client-side.json"))
open(f"{out}/deployment-update.json", "w").write(compact(u))
PY

# --- servers ----------------------------------------------------------------------------
wait_ready() { # PORT
    for _ in $(seq 1 600); do
        if curl -fs --cacert "$CA" "https://localhost:$1/readyz" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "server on :$1 never became ready" >&2
    exit 1
}

start_handoff() { # STATE_DIR [taskset cpu]
    local cpu="${2:-}"
    local pre=()
    [ -n "$cpu" ] && pre=(taskset -c "$cpu")
    # Logs go to /dev/null: every decision is still formatted and written (one write(2)).
    "${pre[@]}" "$HANDOFF" serve --listen "127.0.0.1:$HANDOFF_PORT" \
        --tls-cert "$OUT/certs/tls.crt" --tls-key "$OUT/certs/tls.key" \
        --state "$1" --drain-delay 0s --drain-timeout 1s 2>/dev/null &
    HANDOFF_PID=$!
    PIDS+=("$HANDOFF_PID")
    wait_ready "$HANDOFF_PORT"
}

stop() { # PID
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# cpu_ticks N: busy and total jiffies of cpu N from /proc/stat.
cpu_ticks() {
    awk -v c="cpu$1" '$1==c { t=0; for (i=2;i<=NF;i++) t+=$i; print t-$5-$6, t }' /proc/stat
}

# run NAME URL BODY PROTO [extra oha flags]: one bounded oha run, pinned; JSON to runs/NAME.json
# with the busy share of the server's and the client's cores added.
run() {
    local name="$1" url="$2" body="$3" proto="$4"; shift 4
    local conn=(-c "$H1_CONNS")
    [ "$proto" = h2 ] && conn=(--http2 -c "$H2_CONNS" -p "$H2_STREAMS")
    local s0 c0 s1 c1 la
    la="$(loadavg)"
    read -r s0b s0t < <(cpu_ticks "$SERVER_CPU")
    read -r c0b c0t < <(cpu_ticks "$CLIENT_CPU")
    taskset -c "$CLIENT_CPU" oha --no-tui --output-format json --cacert "$CA" \
        -z "${DURATION}s" --wait-ongoing-requests-after-deadline "${conn[@]}" "$@" \
        -m POST -H 'Content-Type: application/json' -D "$body" \
        "$url?timeout=10s" >"$OUT/runs/$name.json"
    read -r s1b s1t < <(cpu_ticks "$SERVER_CPU")
    read -r c1b c1t < <(cpu_ticks "$CLIENT_CPU")
    python3 - "$OUT/runs/$name.json" "$la" \
        "$(( (s1b - s0b) * 10000 / (s1t - s0t + 1) ))" "$(( (c1b - c0b) * 10000 / (c1t - c0t + 1) ))" <<'PY'
import json, sys
p, la, s, c = sys.argv[1:]
d = json.load(open(p))
d["bench"] = {"loadavg": la, "server_cpu_busy_pct": int(s) / 100, "client_cpu_busy_pct": int(c) / 100}
json.dump(d, open(p, "w"))
PY
    python3 - "$OUT/runs/$name.json" "$name" <<'PY' >&2
import json, sys
d = json.load(open(sys.argv[1])); s = d["summary"]; b = d["bench"]
codes = d.get("statusCodeDistribution", {})
errs = d.get("errorDistribution", {})
lp = d["latencyPercentiles"]
print(f"  {sys.argv[2]:<34} {s['requestsPerSec']:>9.0f} req/s  p50 {lp['p50']*1e3:6.3f} ms"
      f"  p99 {lp['p99']*1e3:6.3f} ms  server cpu {b['server_cpu_busy_pct']}%"
      f"  client cpu {b['client_cpu_busy_pct']}%  codes {codes} {errs or ''}  load {b['loadavg']}")
PY
}

rps() { python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["summary"]["requestsPerSec"]))' "$1"; }

# --- load -------------------------------------------------------------------------------
if [ "$WHAT" = all ] || [ "$WHAT" = load ]; then
    log "load average before: $(loadavg) (a busy machine skews every figure; see BENCHMARKS.md)"
    STATE="$OUT/state-10000"
    gen_state "$STATE" 10000
    taskset -c "$SERVER_CPU" "$FLOOR" --listen "127.0.0.1:$FLOOR_PORT" \
        --tls-cert "$OUT/certs/tls.crt" --tls-key "$OUT/certs/tls.key" 2>/dev/null &
    FLOOR_PID=$!
    PIDS+=("$FLOOR_PID")
    wait_ready "$FLOOR_PORT"
    start_handoff "$STATE" "$SERVER_CPU"

    # Verdicts first: the DELETE is denied, the Deployment update is pinned.
    curl -fs --cacert "$CA" -H 'Content-Type: application/json' --data-binary @"$OUT/delete-2k.json" \
        "https://localhost:$HANDOFF_PORT/validate/sync-finalizer" | grep -q '"allowed":false' \
        || { echo "handoff did not deny the DELETE review" >&2; exit 1; }
    curl -fs --cacert "$CA" -H 'Content-Type: application/json' --data-binary @"$OUT/deployment-update.json" \
        "https://localhost:$HANDOFF_PORT/mutate/move-window" | grep -q '"patchType":"JSONPatch"' \
        || { echo "handoff did not pin the Deployment update" >&2; exit 1; }

    for proto in h1 h2; do
        for review in delete update; do
            case $review in
                delete) body="$OUT/delete-2k.json" path=/validate/sync-finalizer ;;
                update) body="$OUT/deployment-update.json" path=/mutate/move-window ;;
            esac
            log "$proto $review: max throughput"
            # A short warm-up of each, then the measured runs back to back.
            DURATION=2 run "warm-floor-$proto-$review" "https://localhost:$FLOOR_PORT$path" "$body" "$proto"
            DURATION=2 run "warm-handoff-$proto-$review" "https://localhost:$HANDOFF_PORT$path" "$body" "$proto"
            run "max-floor-$proto-$review" "https://localhost:$FLOOR_PORT$path" "$body" "$proto"
            run "max-handoff-$proto-$review" "https://localhost:$HANDOFF_PORT$path" "$body" "$proto"
            half=$(( $(rps "$OUT/runs/max-floor-$proto-$review.json") / 2 ))
            log "$proto $review: latency at $half req/s (half the floor's max)"
            run "half-floor-$proto-$review" "https://localhost:$FLOOR_PORT$path" "$body" "$proto" \
                -q "$half" --latency-correction
            run "half-handoff-$proto-$review" "https://localhost:$HANDOFF_PORT$path" "$body" "$proto" \
                -q "$half" --latency-correction
            # Where handoff's own max is below that rate the run above only measures a queue;
            # so also at half of handoff's own max, the load it can carry with headroom.
            own=$(( $(rps "$OUT/runs/max-handoff-$proto-$review.json") / 2 ))
            log "$proto $review: latency at $own req/s (half handoff's max)"
            run "own-floor-$proto-$review" "https://localhost:$FLOOR_PORT$path" "$body" "$proto" \
                -q "$own" --latency-correction
            run "own-handoff-$proto-$review" "https://localhost:$HANDOFF_PORT$path" "$body" "$proto" \
                -q "$own" --latency-correction
            # And at a rate a webhook for deletes really sees, where neither server queues.
            log "$proto $review: latency at $LOW_RATE req/s"
            run "low-floor-$proto-$review" "https://localhost:$FLOOR_PORT$path" "$body" "$proto" \
                -q "$LOW_RATE" --latency-correction
            run "low-handoff-$proto-$review" "https://localhost:$HANDOFF_PORT$path" "$body" "$proto" \
                -q "$LOW_RATE" --latency-correction
        done
    done
    stop "$HANDOFF_PID"
    stop "$FLOOR_PID"
    log "load average after: $(loadavg)"
fi

# --- memory -----------------------------------------------------------------------------
# Located namespaces through a real API server and as --state files (benches/memory.py; it
# needs ../shared/envtest or KUBEBUILDER_ASSETS), with its own table.
if [ "$WHAT" = all ] || [ "$WHAT" = memory ]; then
    OUT="$OUT" python3 "$ROOT/benches/memory.py"
fi

# --- report -----------------------------------------------------------------------------
python3 - "$OUT" "$WHAT" <<'PY' | tee "$OUT/results.md"
import json, os, sys
out, what = sys.argv[1], sys.argv[2]
def load(name):
    p = f"{out}/runs/{name}.json"
    return json.load(open(p)) if os.path.exists(p) else None
def ok(d):
    return sum(v for k, v in d.get("statusCodeDistribution", {}).items() if k == "200")
def pairs(prefix):
    """(protocol, review, floor run, handoff run) for every pair of runs that both exist."""
    for proto in ("h1", "h2"):
        for review in ("delete", "update"):
            f, h = load(f"{prefix}-floor-{proto}-{review}"), load(f"{prefix}-handoff-{proto}-{review}")
            if f and h:
                yield proto, review, f, h
if what in ("all", "load", "report"):
    print("## Throughput (max, requests/s)\n")
    print("| protocol | review | floor | handoff | handoff/floor | server core busy (floor / handoff) | client core busy (floor / handoff) | non-200 or errors |")
    print("|---|---|---:|---:|---:|---|---|---|")
    for proto, review, f, h in pairs("max"):
        fr, hr = f["summary"]["requestsPerSec"], h["summary"]["requestsPerSec"]
        errs = [sum(x.get("errorDistribution", {}).values()) + sum(v for k, v in x.get("statusCodeDistribution", {}).items() if k != "200") for x in (f, h)]
        print(f"| {proto} | {review} | {fr:,.0f} | {hr:,.0f} | {hr/fr:.2f} | "
              f"{f['bench']['server_cpu_busy_pct']}% / {h['bench']['server_cpu_busy_pct']}% | "
              f"{f['bench']['client_cpu_busy_pct']}% / {h['bench']['client_cpu_busy_pct']}% | {errs[0]} / {errs[1]} |")
    for prefix, title, rate_of in (
        ("half", "at half of the floor's max", "floor"),
        ("own", "at half of handoff's own max", "handoff"),
        ("low", "at a fixed low rate", None),
    ):
        print(f"\n## Latency {title} (ms; corrected for coordinated omission)\n")
        print("| protocol | review | rate | p50 floor | p50 handoff | ratio | p99 floor | p99 handoff | ratio | p99.9 floor | p99.9 handoff | ratio | note |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for proto, review, f, h in pairs(prefix):
            rate = (int(load(f"max-{rate_of}-{proto}-{review}")["summary"]["requestsPerSec"] / 2)
                    if rate_of else round(h["summary"]["requestsPerSec"]))
            hmax = load(f"max-handoff-{proto}-{review}")["summary"]["requestsPerSec"]
            row = [proto, review, f"{rate:,}"]
            for q in ("p50", "p99", "p99.9"):
                a, b = f["latencyPercentiles"][q] * 1e3, h["latencyPercentiles"][q] * 1e3
                row += [f"{a:.3f}", f"{b:.3f}", f"{b/a:.2f}"]
            row.append("above handoff's max: a queue" if rate > hmax else "")
            print("| " + " | ".join(row) + " |")
    print("\n## Server CPU per request at the same rate (µs; both at half of handoff's max)\n")
    print("Busy share of the server's core over the run divided by the requests answered: what each")
    print("request costs the server whether or not the client keeps up (at max throughput the floor")
    print("is partly held back by the client, which flatters handoff/floor).\n")
    print("| protocol | review | rate | floor | handoff | floor/handoff |")
    print("|---|---|---:|---:|---:|---:|")
    cost = lambda d: d["bench"]["server_cpu_busy_pct"] / 100 * d["summary"]["total"] / max(ok(d), 1) * 1e6
    for proto, review, f, h in pairs("own"):
        fc, hc = cost(f), cost(h)
        print(f"| {proto} | {review} | {round(h['summary']['requestsPerSec']):,} | {fc:.1f} | {hc:.1f} | {fc/hc:.2f} |")
    las = sorted({load(n)["bench"]["loadavg"] for n in [x[:-5] for x in os.listdir(f"{out}/runs") if x.startswith(("max-", "half-", "own-", "low-"))]})
    print(f"\nload averages seen at the start of the runs: {', '.join(las)}")
PY
