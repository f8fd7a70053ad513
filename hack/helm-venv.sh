#!/usr/bin/env bash
# The real Helm engine for tests/helm.rs: helm-sdkpy (Helm v4's Go code as a shared library,
# linux-amd64, inside the wheel) and cffi, from PyPI, in a virtualenv of their own. Prints the
# venv's python, for HANDOFF_HELM_PYTHON. Idempotent: a venv that already imports the pinned
# version is kept.
#
#   export HANDOFF_HELM_PYTHON=$(hack/helm-venv.sh)     # ~/.cache/handoff-helm-venv by default
#   cargo test --test helm
#
# helm-sdkpy's metadata asks for Python >= 3.12 while its code is plain Python over the
# library; on an older python3 (3.11 here) it is installed with --ignore-requires-python, and the
# import below proves it loads.
set -euo pipefail

HELM_SDKPY=0.1.32
CFFI=2.1.1
VENV=${HANDOFF_HELM_VENV:-$HOME/.cache/handoff-helm-venv}
PYTHON=${PYTHON:-python3}
check() {
  "$VENV/bin/python" -c "import helm_sdkpy, sys; sys.exit(helm_sdkpy.__version__ != '$HELM_SDKPY')" 2>/dev/null
}

if ! check; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >&2 || {
    echo "helm-venv: '$PYTHON -m venv' failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
  flags=()
  if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    flags+=(--ignore-requires-python)
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${flags[@]}" \
    "helm-sdkpy==$HELM_SDKPY" "cffi==$CFFI" >&2
  check || {
    echo "helm-venv: $VENV/bin/python cannot import helm_sdkpy $HELM_SDKPY after installing it" >&2
    exit 1
  }
fi
echo "$VENV/bin/python"
