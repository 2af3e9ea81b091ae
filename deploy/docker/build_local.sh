#!/bin/sh
# Builds the real Dockerfile without a Docker engine: Debian's buildah, on a base image bootstrapped
# locally from Debian packages (mmdebstrap), so nothing but the Debian and PyPI package registries is
# reached. Used by scripts/release.sh and tests/deploy/test_deploy_image_built.py.
#
#   deploy/docker/build_local.sh [--repository NAME] [--oci-archive FILE]
#
# Prints the built image's name (NAME:<tag of deploy/docker/build.sh>) as its last line. The base
# (Debian's python3 and python3-venv on this machine's Debian suite and mirrors) is built once and
# kept under a name that changes with what goes into it, so later builds only run the Dockerfile;
# with --layers, buildah also reuses the dependency layer while requirements.txt is unchanged.
# Installs buildah and mmdebstrap with apt-get when they are missing (CI runs as root on a fresh
# Debian machine). Inside the build, pip reaches PyPI through this machine's CA bundle, mounted at
# the path Debian's pip reads, so the image itself carries no certificate or pip setting.
set -eu

repository=airflow-dupguard
archive=""
while [ $# -gt 0 ]; do
  case "$1" in
    --repository) repository="$2"; shift 2 ;;
    --oci-archive) archive="$2"; shift 2 ;;
    *) echo "usage: $0 [--repository NAME] [--oci-archive FILE]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."

if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y --no-install-recommends buildah mmdebstrap uidmap >&2
fi

# No engine and no cgroups here: every step runs in a chroot. Storage is containers-storage's default
# (overlay, in /var/lib/containers), which needs that folder on a real file system, not on overlayfs.
export BUILDAH_ISOLATION=chroot

# This machine's Debian suite and mirrors (its apt sources), read rather than named here.
# shellcheck disable=SC1091 # the machine's own file
. /etc/os-release
suite="$VERSION_CODENAME"
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
packages="python3,python3-venv"
base_key="$(printf '%s\n%s\n%s\n' "$suite" "$packages" "$(cat "$sources")" | sha256sum | cut -c1-12)"
base="localhost/dupguard-python-base:$suite-$base_key"
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  rootfs="$(mktemp -d)/rootfs.tar"
  # shellcheck disable=SC2016 # "$1" is the hook's argument, expanded by mmdebstrap
  mmdebstrap --variant=minbase --include="$packages" --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$suite" "$rootfs" "$sources" >&2
  container="$(buildah from scratch)"
  buildah add "$container" "$rootfs" / >&2
  buildah commit --rm "$container" "$base" >&2
  rm -rf "$(dirname "$rootfs")"
fi

ca=/etc/ssl/certs/ca-certificates.crt
tag="$(sh deploy/docker/build.sh --print-tag)"
BUILD_COMMAND="buildah bud --layers --volume $ca:$ca:ro --build-arg PYTHON_IMAGE=$base" \
  sh deploy/docker/build.sh "$repository" >&2
image="localhost/$repository:$tag"
if [ -n "$archive" ]; then
  rm -f "$archive"
  buildah push "$image" "oci-archive:$archive:$repository:$tag" >&2
fi
echo "$image"
