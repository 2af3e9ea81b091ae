#!/bin/sh
# Builds the image with its tag and OCI labels taken from the checkout (docs/how-to/deploy-kubernetes.md, section 1):
#
#   deploy/docker/build.sh registry.example.com/airflow-dupguard [extra build args]
#   deploy/docker/build.sh --print registry.example.com/airflow-dupguard   # show the command only
#   deploy/docker/build.sh --print-tag                                      # the tag alone
#
# Tag scheme: <version> (pyproject.toml) when HEAD is the release tag v<version> and the tree is
# clean: the tag the docs and the chart's appVersion name. Otherwise <version>-<12-char commit>, with
# -dirty for uncommitted changes, and <version>-nogit for a tree without git (an unpacked sdist):
# nothing proves such a tree is the release. Release tags are never rebuilt; `latest` is never
# produced. Labels: org.opencontainers.image.version/revision/source.
#
# BUILD_COMMAND (default `docker build`) is the builder; deploy/docker/build_local.sh sets it to
# buildah. --print needs neither git nor a builder.
set -eu

print_only=""
case "${1:-}" in
  --print) print_only=1; shift ;;
  --print-tag) print_only=tag; shift ;;
esac
if [ "$print_only" != tag ] && [ $# -lt 1 ]; then
  echo "usage: $0 [--print] REPOSITORY [build args...] | $0 --print-tag" >&2
  exit 2
fi
repository="${1:-}"
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/../.."

version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
if command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
  revision="$(git rev-parse HEAD)"
  source_url="$(git config --get remote.origin.url || echo unknown)"
  dirty=""
  git diff --quiet HEAD -- || dirty="-dirty"
  if [ -z "$dirty" ] && [ "$(git tag --points-at HEAD --list "v$version")" = "v$version" ]; then
    tag="$version"
  else
    tag="$version-$(git rev-parse --short=12 HEAD)$dirty"
  fi
else
  revision=unknown
  source_url=unknown
  tag="$version-nogit"
fi
if [ "$print_only" = tag ]; then
  echo "$tag"
  exit 0
fi

# shellcheck disable=SC2086 # BUILD_COMMAND is a command line: split on purpose
set -- ${BUILD_COMMAND:-docker build} \
  --build-arg "VERSION=$version" \
  --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" \
  --tag "$repository:$tag" "$@" .
if [ -n "$print_only" ]; then
  echo "$@"
else
  exec "$@"
fi
