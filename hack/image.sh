#!/usr/bin/env bash
# Builds the Dockerfile's image without a Docker daemon and without pulling anything: buildah
# commits the static binary (hack/static-binary.sh) onto an empty (`scratch`) base with the same
# user, entrypoint, command, ports and OCI labels as the Dockerfile's final stage, and writes it
# as an OCI archive.
#
#   hack/image.sh                    # out/handoff-<version>.oci.tar, tagged handoff:<version>
#   podman load -i out/handoff-0.1.0.oci.tar      # or: skopeo copy oci-archive:… docker://…
#
# Needs buildah (Debian's package; installed when missing and we are root). Runs as root with
# the vfs storage driver under out/buildah/, so it needs no user namespaces, no overlay mounts
# and leaves nothing in /var/lib/containers.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v buildah >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "image: installing buildah" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >&2
    else
        echo "image: needs buildah (apt-get install buildah)" >&2
        exit 1
    fi
fi

bin=$(hack/static-binary.sh)
version=$("$bin" --version | awk '{print $2}')
want=$(sed -n 's/^ARG VERSION=//p' Dockerfile)
if [ "$version" != "$want" ]; then
    echo "image: the binary says $version, the Dockerfile's ARG VERSION says $want" >&2
    exit 1
fi
# The labels, user, entrypoint and command of the Dockerfile's final stage.
label() { sed -n "s/^.*org\.opencontainers\.image\.$1=\"\([^\"]*\)\".*$/\1/p" Dockerfile | head -1; }
source_url=$(label source)
licenses=$(label licenses)
description=$(label description)
user=$(sed -n 's/^USER //p' Dockerfile)

mkdir -p out
store=$PWD/out/buildah
b() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }
ctr=$(b from --name "handoff-$version-$$" scratch)
trap 'b rm "$ctr" >/dev/null 2>&1 || true' EXIT
# Symbols stay in the cargo build (perf reads them: BENCHMARKS.md); the image gets a stripped copy.
cp "$bin" out/handoff
strip out/handoff
b copy --chmod 0555 "$ctr" out/handoff /handoff >/dev/null
b config \
    --user "$user" \
    --entrypoint '["/handoff"]' \
    --cmd serve \
    --port 8443 --port 9090 \
    --label org.opencontainers.image.title=handoff \
    --label "org.opencontainers.image.description=$description" \
    --label "org.opencontainers.image.source=$source_url" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.licenses=$licenses" \
    --label "org.opencontainers.image.revision=$("$bin" --version | sed -n 's/.*(commit \(.*\))$/\1/p')" \
    "$ctr"
# Created at the commit's time, so the same commit gives the same image.
created=$(git log -1 --format=%ct 2>/dev/null || echo 0)
b commit --quiet --format oci --timestamp "$created" "$ctr" "handoff:$version" >/dev/null
archive=out/handoff-$version.oci.tar
rm -f "$archive"
b push --quiet "handoff:$version" "oci-archive:$archive:handoff:$version"

echo "image: handoff:$version -> $archive ($(du -h "$archive" | cut -f1))" >&2
b inspect --type image --format \
    'image: user {{.OCIv1.Config.User}}, entrypoint {{.OCIv1.Config.Entrypoint}}, cmd {{.OCIv1.Config.Cmd}}, labels {{.OCIv1.Config.Labels}}' \
    "handoff:$version" >&2
echo >&2

# Check the archive as a runtime would read it: oci-layout, index.json -> manifest -> config
# and the one layer, whose only file is /handoff; run that file from the unpacked layer alone.
check=$(mktemp -d)
trap 'b rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$check"' EXIT
tar -C "$check" -xf "$archive"
layer=$(python3 - "$check" <<'PY'
import json, sys, hashlib, os
root = sys.argv[1]
blob = lambda d: os.path.join(root, "blobs", *d.split(":"))
def load(d):
    data = open(blob(d), "rb").read()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == d, f"digest mismatch {d}"
    return json.loads(data)
assert json.load(open(os.path.join(root, "oci-layout")))["imageLayoutVersion"] == "1.0.0"
index = json.load(open(os.path.join(root, "index.json")))
manifest = load(index["manifests"][0]["digest"])
config = load(manifest["config"]["digest"])
c = config["config"]
assert c["User"] == "65532:65532" and c["Entrypoint"] == ["/handoff"], c
assert len(manifest["layers"]) == 1, manifest["layers"]
print(blob(manifest["layers"][0]["digest"]))
PY
)
mkdir "$check/rootfs"
tar -C "$check/rootfs" -xzf "$layer"
files=$(cd "$check/rootfs" && find . -mindepth 1 | sort | tr '\n' ' ')
[ "$files" = "./handoff " ] || { echo "image: the layer holds $files" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then
    echo "image: from the layer alone: $(env -i "$(command -v chroot)" --userspec=65532:65532 "$check/rootfs" /handoff --version)" >&2
fi
echo "$archive"
