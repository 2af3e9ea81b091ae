"""Runs a command in a locally built image (deploy/docker/build_local.sh) as Kubernetes runs the pod:
the image's USER, ENV and WORKDIR, its ENTRYPOINT, the root filesystem read-only and only /tmp
writable (a tmpfs, as the manifests' emptyDir).

    python3 deploy/docker/run_local.py IMAGE [--env NAME=VALUE ...] [--entrypoint PROGRAM] -- ARGS...

No container engine runs containers here (no cgroups), and `buildah run` cannot make the root
read-only, so this does what the engine would do by hand: buildah mounts the image's root, a private
mount namespace (unshare) binds it read-only with a fresh /tmp, /proc and /dev, and chroot starts the
entrypoint as the image's user with the image's environment only. Needs root and buildah.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys


def image_config(image: str) -> dict[str, object]:
    out = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True, text=True, check=True)
    config: dict[str, object] = json.loads(out.stdout)["OCIv1"]["config"]
    return config


def strings(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE added to the image's ENV")
    parser.add_argument("--entrypoint", help="a program of the image to run instead of its ENTRYPOINT")
    # What follows `--` goes to the entrypoint (default: the image's CMD).
    args = argv[argv.index("--") + 1 :] if "--" in argv else []
    options = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    config = image_config(options.image)
    user = str(config.get("User") or "0:0")
    env = [*strings(config.get("Env")), *options.env]
    workdir = str(config.get("WorkingDir") or "/")
    entrypoint = [options.entrypoint] if options.entrypoint else strings(config.get("Entrypoint"))
    command = [*entrypoint, *(args or strings(config.get("Cmd")))]

    container = subprocess.run(
        ["buildah", "from", "--pull-never", options.image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        root = subprocess.run(["buildah", "mount", container], capture_output=True, text=True, check=True)
        inside = shlex.join(["cd", workdir]) + " && exec " + shlex.join(["/usr/bin/env", "-i", *env, *command])
        script = "\n".join(
            [
                "set -e",
                'new="$(mktemp -d)"',
                'mount --rbind "$1" "$new"',
                'mount -o remount,bind,ro "$new"',  # the read-only root filesystem
                'mount -t tmpfs -o mode=1777,size=64m tmpfs "$new/tmp"',  # the pod's /tmp emptyDir
                'mount -t proc proc "$new/proc"',
                'mount --rbind /dev "$new/dev"',
                'exec chroot --userspec="$2" "$new" /bin/sh -c "$3"',
            ]
        )
        return subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "run_local",
                root.stdout.strip(),
                user,
                inside,
            ],
            check=False,
        ).returncode
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
