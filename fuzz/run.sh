#!/usr/bin/env bash
# Run every cargo-fuzz target (or the ones named) for SECONDS each, one at a time, and print
# per target: executions, exec/s, corpus size and whether it crashed.
#
#   fuzz/run.sh [SECONDS] [TARGET...]        SECONDS defaults to 60
#
# Environment:
#   SANITIZER=address|none   default: address when the toolchain ships its runtime, else none
#   HANDOFF_FIXTURES=DIR     seed AdmissionReviews (default: tests/fixtures)
#   CARGO_BUILD_JOBS=N       build parallelism (default 1)
#   KEEP_GOING=1             libFuzzer fork mode: record crashes and go on fuzzing
#
# Works on stable Rust: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags. Exits 1 if any
# target crashed; the input is in fuzz/artifacts/<target>/ (replay: cargo fuzz run <target> FILE).
set -euo pipefail

fuzz_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$fuzz_dir")
cd "$fuzz_dir"

secs=${1:-60}
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ $secs =~ ^[0-9]+$ ]] || [[ $secs -eq 0 ]]; then
    echo "usage: $0 [SECONDS] [TARGET...]" >&2
    exit 2
fi

export RUSTC_BOOTSTRAP=1
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
export CARGO_TERM_COLOR=never

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz ..." >&2
    cargo install cargo-fuzz --locked
fi

if [[ -z ${SANITIZER:-} ]]; then
    host=$(rustc -vV | sed -n 's/^host: //p')
    if compgen -G "$(rustc --print sysroot)/lib/rustlib/$host/lib/librustc-*_rt.asan.a" >/dev/null; then
        SANITIZER=address
    else
        SANITIZER=none
    fi
fi

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

fixtures=${HANDOFF_FIXTURES:-$repo/tests/fixtures}
if ! compgen -G "$fixtures/*.json" >/dev/null; then
    echo "warning: no seed fixtures in $fixtures; starting from empty corpora" >&2
fi

echo "building ${targets[*]} (sanitizer: $SANITIZER) ..." >&2
for t in "${targets[@]}"; do
    cargo fuzz build --sanitizer "$SANITIZER" "$t" >&2
done

logs="$fuzz_dir/target/run-logs"
mkdir -p "$logs"
rows=()
crashed=0
for t in "${targets[@]}"; do
    corpus="corpus/$t"
    mkdir -p "$corpus" "artifacts/$t"
    # Seeds: the recorded AdmissionReviews and a few small hand-written ones (the corpus
    # folder is git-ignored).
    if compgen -G "$fixtures/*.json" >/dev/null; then
        cp "$fixtures"/*.json "$corpus/"
    fi
    if [[ -d seeds/$t ]]; then
        cp seeds/"$t"/* "$corpus/"
    fi
    opts=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=4096)
    if [[ -f $fuzz_dir/dict/$t.dict ]]; then opts+=(-dict="$fuzz_dir/dict/$t.dict"); fi
    if [[ $t == identity ]]; then
        # NUL-separated cluster, name, uid, username; short inputs are all it needs.
        printf 'root:org:ws\0us-west1\0syncTargetUID\0system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw' \
            >"$corpus/seed-us-west1"
        opts+=(-max_len=1024)
    fi
    if [[ ${KEEP_GOING:-0} == 1 ]]; then
        opts+=(-fork=1 -ignore_crashes=1)
    else
        opts+=(-print_final_stats=1)
    fi
    before=$(find "artifacts/$t" -type f | wc -l)
    log="$logs/$t.log"
    echo "fuzzing $t for ${secs}s (log: $log) ..." >&2
    set +e
    cargo fuzz run --sanitizer "$SANITIZER" "$t" "$corpus" -- "${opts[@]}" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [[ -z $execs ]]; then
        # Fork mode prints no final stats: read its last progress line.
        last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)
        execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
        elapsed=$(sed -n 's/.* time: \([0-9]*\)s.*/\1/p' <<<"$last")
        if [[ -n $execs && ${elapsed:-0} -gt 0 ]]; then rate=$((execs / elapsed)); fi
    fi
    size=$(find "$corpus" -type f | wc -l)
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    result=ok
    if [[ $rc -ne 0 ]]; then
        crashed=1
        if [[ -n $artifact ]]; then
            result="CRASH $artifact"
        else
            result="FAILED (exit $rc, see $log)"
        fi
    elif [[ $(find "artifacts/$t" -type f | wc -l) -gt $before ]]; then
        crashed=1
        result="CRASH (kept going; inputs in fuzz/artifacts/$t/)"
    fi
    rows+=("$(printf '%-18s %12s %8s %8s  %s' "$t" "${execs:-?}" "${rate:-?}" "$size" "$result")")
done

printf '%-18s %12s %8s %8s  %s\n' target executions exec/s corpus result
printf '%s\n' "${rows[@]}"
exit $crashed
