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
# Every link between the pages mdBook wrote, and every anchor, resolves in the HTML itself
# (tests/docs.rs checks the Markdown the same way, under `cargo test`).
python3 - docs/book <<'PY'
import html.parser, os, sys, urllib.parse
book = sys.argv[1]
ids, links = {}, []
class Page(html.parser.HTMLParser):
    def __init__(self, path):
        super().__init__()
        self.path = path
        ids[path] = set()
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            ids[self.path].add(a["id"])
        if tag == "a" and a.get("href"):
            links.append((self.path, a["href"]))
for d, _, names in os.walk(book):
    for n in names:
        if n.endswith(".html"):
            path = os.path.relpath(os.path.join(d, n), book)
            Page(path).feed(open(os.path.join(d, n), encoding="utf-8").read())
bad = []
for page, href in links:
    url = urllib.parse.urlparse(href)
    if url.scheme or href.startswith("//") or href.startswith("mailto:"):
        continue
    target = os.path.normpath(os.path.join(os.path.dirname(page), urllib.parse.unquote(url.path))) if url.path else page
    if target.endswith("/") or os.path.isdir(os.path.join(book, target)):
        target = os.path.join(target, "index.html")
    if not os.path.exists(os.path.join(book, target)):
        bad.append(f"{page}: {href}: no page {target}")
    elif url.fragment and target in ids and url.fragment not in ids[target]:
        bad.append(f"{page}: {href}: no anchor #{url.fragment} in {target}")
if bad:
    print("broken links in the built book:", *bad, sep="\n", file=sys.stderr)
    sys.exit(1)
print(f"the book's {len(links)} links resolve")
PY
