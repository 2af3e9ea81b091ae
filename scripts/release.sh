#!/usr/bin/env bash
# Builds a release from a clean tree into dist/ (`make release`; .github/workflows/release.yml runs the
# same on a v* tag and publishes what it leaves there). docs/how-to/release.md says how a release is made.
#
#   scripts/release.sh            # everything
#   scripts/release.sh --no-image # without the image (a machine without buildah and root)
#
# dist/python/  the wheel and sdist of airflow-dupguard and of the guard airflow-dupguard-guard,
#               built with `uv build` (or `python -m build`) and checked with `twine check --strict` (as PyPI does)
# dist/chart/   dupguard-<version>.tgz, linted strict and packaged with helm-python-sdk
# dist/image/   airflow-dupguard-<tag>.oci.tar (deploy/docker/build_local.sh), after its smoke run
# dist/SHA256SUMS
#
# Refuses a tree with uncommitted or untracked files (they would reach the sdist or the image
# unrecorded), and a HEAD tagged v* with another version than pyproject.toml's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"

image=1
case "${1:-}" in
  --no-image) image="" ;;
  "") ;;
  *) echo "usage: $0 [--no-image]" >&2; exit 2 ;;
esac

if [ -n "$(git status --porcelain)" ]; then
  echo "release: the tree is not clean (commit or remove these first):" >&2
  git status --short >&2
  exit 1
fi
version="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
for tag in $(git tag --points-at HEAD --list 'v*'); do
  if [ "$tag" != "v$version" ]; then
    echo "release: HEAD is tagged $tag but pyproject.toml says $version" >&2
    exit 1
  fi
done

rm -rf dist
mkdir -p dist/python
# --sdist --wheel builds both from the tree (the guard's wheel takes detector/guard/policy.py from it).
# uv build (scripts/bootstrap.sh installs uv) reuses its cached build backend: 23 s here against
# about 5 minutes for python -m build's four fresh build environments on a busy machine
# (benchmarks/results/release_build_times-20261207.json).
for project in . deploy/airflow-guard; do
  if command -v uv >/dev/null 2>&1; then
    uv build --sdist --wheel --out-dir dist/python "$project"
    rm -f dist/python/.gitignore  # uv marks its output folder ignored: not a release file
  else
    "$PY" -m build --sdist --wheel --outdir dist/python "$project"
  fi
done
"$PY" -m twine check --strict dist/python/*
"$PY" scripts/package_chart.py dist/chart

if [ -n "$image" ]; then
  mkdir -p dist/image
  tag="$(sh deploy/docker/build.sh --print-tag)"
  built="$(deploy/docker/build_local.sh --oci-archive "dist/image/airflow-dupguard-$tag.oci.tar" | tail -n 1)"
  # The image must say the version it is tagged with, as its user on a read-only root.
  said="$(python3 deploy/docker/run_local.py "$built" -- --version)"
  if [ "$said" != "dupguard $version" ]; then
    echo "release: $built says '$said', not 'dupguard $version'" >&2
    exit 1
  fi
fi

sums="$(cd dist && find . -type f | sed 's|^\./||' | sort | xargs sha256sum)"
echo "$sums" > dist/SHA256SUMS
echo "release $version:" >&2
cat dist/SHA256SUMS >&2
