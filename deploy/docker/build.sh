#!/bin/sh
# Builds the image with its tag and OCI labels taken from the checkout (docs/deploy.md, section 1):
#
#   deploy/docker/build.sh registry.example.com/airflow-dupguard [extra docker build args]
#   deploy/docker/build.sh --print registry.example.com/airflow-dupguard   # show the command only
#
# Tag scheme: <version> (pyproject.toml) when HEAD is the release tag v<version> and the tree is
# clean; otherwise <version>-<12-char commit>, with -dirty for uncommitted changes. Release tags are
# never rebuilt; `latest` is never produced. Labels: org.opencontainers.image.version/revision/source.
set -eu

print_only=""
if [ "${1:-}" = "--print" ]; then
  print_only=1
  shift
fi
if [ $# -lt 1 ]; then
  echo "usage: $0 [--print] REPOSITORY [docker build args...]" >&2
  exit 2
fi
repository="$1"
shift
cd "$(dirname "$0")/../.."

version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
revision="$(git rev-parse HEAD)"
source_url="$(git config --get remote.origin.url || echo unknown)"
dirty=""
git diff --quiet HEAD -- || dirty="-dirty"
if [ -z "$dirty" ] && [ "$(git tag --points-at HEAD --list "v$version")" = "v$version" ]; then
  tag="$version"
else
  tag="$version-$(git rev-parse --short=12 HEAD)$dirty"
fi

set -- docker build \
  --build-arg "VERSION=$version" \
  --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" \
  --tag "$repository:$tag" "$@" .
if [ -n "$print_only" ]; then
  echo "$@"
else
  exec "$@"
fi
