#!/usr/bin/env bash
# The static binary serves /healthz and /readyz from an empty root: a folder holding nothing but
# the binary, its certificate files and a tiny --state folder (there is no cluster here), run
# with an empty environment as the image's user (65532), chrooted when we are root.
#
#   hack/static-smoke.sh                  # builds it with hack/static-binary.sh
#   HANDOFF_BIN=path hack/static-smoke.sh # or smoke-tests a binary built already
#
# Only loopback traffic; the server is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${HANDOFF_BIN:-$(hack/static-binary.sh)}
echo "static-smoke: $("$bin" --version), $(du -h "$bin" | cut -f1)"

work=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# The root: /handoff, /certs/tls.{crt,key}, /state/*.yaml. Nothing else: no libc, no
# /etc, no /proc, no /tmp, no shell.
root=$work/root
mkdir -p "$root/certs" "$root/state"
cp "$bin" "$root/handoff"
"$bin" certs --out "$work/certs" --dns localhost --ip 127.0.0.1 >/dev/null 2>&1
cp "$work/certs/tls.crt" "$work/certs/tls.key" "$root/certs/"
chmod 0444 "$root/certs/"*   # readable by 65532 (a throwaway key in a temp folder)
cp examples/state/*.yaml "$root/state/"
echo "static-smoke: root holds: $(cd "$root" && find . -type f | sort | tr '\n' ' ')"

# Below the kernel's ephemeral ports (32768 on), where the tests beside it bind theirs.
port=$((20000 + RANDOM % 12000))
args=(serve --drain-delay 0s --listen "127.0.0.1:$port" --tls-cert /certs/tls.crt --tls-key /certs/tls.key --state /state)
chroot=$(command -v chroot || true)
if [ "$(id -u)" = 0 ] && [ -n "$chroot" ]; then
    how="chroot $root as 65532:65532, env -i"
    env -i "$chroot" --userspec=65532:65532 "$root" /handoff "${args[@]}" >"$work/log" 2>&1 &
else
    # Not root (or no chroot): the same files, relative paths, an empty cwd and environment.
    how="cwd $root, env -i (no chroot: not root)"
    args=(serve --drain-delay 0s --listen "127.0.0.1:$port" --tls-cert certs/tls.crt --tls-key certs/tls.key --state state)
    (cd "$root" && exec env -i ./handoff "${args[@]}") >"$work/log" 2>&1 &
fi
pid=$!
echo "static-smoke: running it with $how on 127.0.0.1:$port"
# A binary that needs a loader or libc (not static) dies here at once: nothing else is there.

get() {
    curl -sS --max-time 2 --cacert "$work/certs/ca.crt" --resolve "localhost:$port:127.0.0.1" \
        "https://localhost:$port$1"
}
for _ in $(seq 1 100); do
    # /readyz says "ok (<each webhook's enforcement mode>)" once ready.
    case "$(get /readyz 2>/dev/null)" in ok*) break ;; esac
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "static-smoke: FAILED: handoff exited:" >&2; cat "$work/log" >&2; exit 1
    fi
    sleep 0.1
done
healthz=$(get /healthz || true)
readyz=$(get /readyz || true)
if [ "$healthz" != ok ] || [ "${readyz%% *}" != ok ]; then
    echo "static-smoke: FAILED: /healthz said '$healthz', /readyz said '$readyz'" >&2
    cat "$work/log" >&2
    exit 1
fi
echo "static-smoke: /healthz ok, /readyz ok (TLS verified against the generated CA)"
kill -TERM "$pid"
wait "$pid" || { echo "static-smoke: FAILED: exit status $? after SIGTERM" >&2; cat "$work/log" >&2; exit 1; }
pid=
echo "static-smoke: passed"
