#!/usr/bin/env bash
# Builds handoff as a fully static release binary and prints its path.
#
#   hack/static-binary.sh            # x86_64-unknown-linux-musl, as the Dockerfile builds it
#   HANDOFF_STATIC_PROFILE=dev hack/static-binary.sh
#                                    # the same, unoptimised (CI: the linking is what it proves,
#                                    # in a third of the release build's time)
#
# The musl target needs the target's std (`rustup target add x86_64-unknown-linux-musl`, from
# the Rust dist server) and musl-gcc for ring's C parts (Debian's musl-tools). Each is installed
# when missing and we may (root with apt-get, or rustup on PATH). When the musl target still
# cannot be had, it falls back to glibc with `-C target-feature=+crt-static`, which is static
# too (and says so on stderr). HANDOFF_STATIC=gnu forces that fallback.
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir=${CARGO_TARGET_DIR:-target}
profile=${HANDOFF_STATIC_PROFILE:-release}
case $profile in
    release) out=release ;;
    dev) out=debug ;;
    *) echo "static-binary: HANDOFF_STATIC_PROFILE must be release or dev, not '$profile'" >&2; exit 2 ;;
esac
musl=x86_64-unknown-linux-musl
gnu=x86_64-unknown-linux-gnu

have_musl() {
    rustup target list --installed 2>/dev/null | grep -qx "$musl" && command -v musl-gcc >/dev/null
}

if [ "${HANDOFF_STATIC:-musl}" = musl ] && ! have_musl; then
    if ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
        echo "static-binary: adding the $musl target" >&2
        timeout 180 rustup target add "$musl" >&2 || true
    fi
    if ! command -v musl-gcc >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "static-binary: installing musl-tools" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools; } >&2 || true
    fi
fi

if [ "${HANDOFF_STATIC:-musl}" = musl ] && have_musl; then
    cargo build --profile "$profile" --locked --target "$musl" >&2
    bin=$target_dir/$musl/$out/handoff
else
    if [ "${HANDOFF_STATIC:-musl}" = musl ]; then
        echo "static-binary: no $musl target here; building glibc with +crt-static instead" >&2
    fi
    # --target keeps these flags off build scripts and proc macros (which must stay dynamic).
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --profile "$profile" --locked --target "$gnu" >&2
    bin=$target_dir/$gnu/$out/handoff
fi

# Static means no program interpreter: ldd has nothing to load.
if ldd "$bin" 2>/dev/null | grep -q '=>'; then
    echo "static-binary: $bin is dynamically linked:" >&2
    ldd "$bin" >&2
    exit 1
fi
echo "$bin"
