#!/bin/sh
# Installs dupguard into a virtual environment in two steps, so that the image keeps its
# dependencies in a layer of their own, built before the code is copied in:
#
#   install.sh deps   create the venv and install the hash-locked dependencies (requirements.txt)
#   install.sh app    build the dupguard wheel from the current directory and install it, no deps
#
# The Dockerfile's RUN lines call this script and nothing else; tests/deploy/test_deploy_image.py replays
# the Dockerfile's builder stage with the same script in a fresh venv, so the two cannot drift.
# Run it from the build context root. DUPGUARD_VENV (default /opt/dupguard) is the target venv,
# PYTHON the interpreter that creates it.
set -eu

VENV="${DUPGUARD_VENV:-/opt/dupguard}"
PYTHON="${PYTHON:-python3}"
PIP_FLAGS="--no-cache-dir --disable-pip-version-check --no-input"

case "${1:-}" in
  deps)
    "$PYTHON" -m venv "$VENV"
    # Exactly the pinned versions, each checked against its sha256 (deploy/docker/requirements.txt).
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install $PIP_FLAGS --require-hashes --no-deps --requirement deploy/docker/requirements.txt
    ;;
  app)
    wheelhouse="$(mktemp -d)"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" wheel $PIP_FLAGS --no-deps --wheel-dir "$wheelhouse" .
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install $PIP_FLAGS --no-deps "$wheelhouse"/*.whl
    rm -rf "$wheelhouse"
    # Fails if the deps step missed a requirement of the wheel that was just installed.
    "$VENV/bin/pip" check
    ;;
  *)
    echo "usage: $0 deps|app" >&2
    exit 2
    ;;
esac
