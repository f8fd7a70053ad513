#!/usr/bin/env bash
# Builds the book (docs/) into docs/book with mdBook from crates.io, installed once into
# ~/.cache/handoff-mdbook; fails on any warning mdBook prints (a missing page, a bad include).
# The links and anchors inside the book are checked by tests/docs.rs, under `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.5.4
root=${HANDOFF_MDBOOK_ROOT:-$HOME/.cache/handoff-mdbook}
mdbook=$root/bin/mdbook
if ! "$mdbook" --version 2>/dev/null | grep -qx "mdbook v$version"; then
  # Without the default features (the live-reloading `serve` and its web server): the build
  # and the search index are all the book needs, and they build in a minute on 2 cores.
  cargo install mdbook --version "$version" --locked --no-default-features --features search \
    --root "$root" --quiet
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$mdbook" build docs 2>&1 | tee "$log"
if grep -E '\b(WARN|ERROR)\b' "$log" >/dev/null; then
  echo "the book built with warnings (above)" >&2
  exit 1
fi
