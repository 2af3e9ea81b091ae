"""The container image's sources: Dockerfile lint, its shape, the build context, locked dependencies and the
tag scheme. The image itself is built from this Dockerfile with buildah and run as its own user on a
read-only root by tests/deploy/test_release.py, on every machine (it installs buildah where missing).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.support import REPO, require_executable

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
INSTALL_SCRIPT = REPO / "deploy" / "docker" / "install.sh"
IMAGE_UID = 10001


@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """A small Dockerfile reader: comments, line continuations, one Stage per FROM."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, args.strip()))
    return stages


def parse_env(args: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in shlex.split(args))


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore globs: `*` and `?` stay within one path element, `**` spans several."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def dockerignore_allows(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    allowed = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern_regex(pattern.removeprefix("!").strip("/"))
        if any(regex.match(prefix) for prefix in prefixes):
            allowed = negate
    return allowed


def read_dockerignore() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def copy_sources(args: str) -> tuple[list[str], str]:
    parts = shlex.split(args)
    assert not any(p.startswith("--") for p in parts), f"unexpected COPY flags in builder: {args}"
    return parts[:-1], parts[-1]


def files_under(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    return sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_hadolint_is_clean() -> None:
    """hadolint reports nothing at all for the Dockerfile (any finding fails, even style)."""
    result = subprocess.run(
        [require_executable("hadolint"), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_install_script_passes_shellcheck() -> None:
    """The script behind the RUN lines is POSIX sh (slim images have no bash) and shellcheck clean."""
    result = subprocess.run(
        [require_executable("shellcheck"), "--shell=sh", str(INSTALL_SCRIPT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_shape(stages: list[Stage]) -> None:
    """Multi-stage, slim base, fixed non-root UID, dupguard entrypoint, venv copied from the builder."""
    assert len(stages) == 2, "a builder stage and a final stage"
    builder, final = stages
    assert builder.name == "builder"
    args = [i.args for i in builder.instructions if i.keyword == "ARG"]  # ARGs before FROM are global
    assert not args
    base_default = DOCKERFILE.read_text().split("ARG PYTHON_IMAGE=", 1)[1].split()[0]
    assert base_default == "python:3.12-slim"
    assert builder.base == final.base == "${PYTHON_IMAGE}"

    # Dependencies are installed in a layer before any code is copied in.
    order = [(i.keyword, i.args) for i in builder.instructions if i.keyword in {"COPY", "RUN"}]
    deps_at = order.index(("RUN", "sh deploy/docker/install.sh deps"))
    code_at = next(n for n, (k, a) in enumerate(order) if k == "COPY" and a.startswith("detector/"))
    assert deps_at < code_at
    assert all(k != "RUN" or a.startswith("sh deploy/docker/install.sh ") for k, a in order), (
        "builder RUN lines must only call deploy/docker/install.sh so the replay test covers them"
    )

    venv = parse_env(" ".join(builder.all("ENV")))["DUPGUARD_VENV"]
    assert final.all("COPY") == [f"--from=builder {venv} {venv}"], "final stage copies only the venv"
    assert not final.all("RUN") or all("install" not in r for r in final.all("RUN"))
    final_env = parse_env(" ".join(final.all("ENV")))
    assert final_env["PATH"].startswith(f"{venv}/bin:")
    assert final_env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert final.all("USER") == [f"{IMAGE_UID}:{IMAGE_UID}"], "numeric USER so runAsNonRoot can verify it"
    assert f"--uid {IMAGE_UID}" in final.all("RUN")[0]
    assert final.all("ENTRYPOINT") == ['["dupguard"]']
    assert final.all("CMD") == ['["run"]']
    assert final.all("EXPOSE") == ["9469"]


def test_build_context_allows_exactly_what_is_copied(stages: list[Stage]) -> None:
    """Every file a COPY needs passes .dockerignore, and the venv, .git and .pg never do."""
    patterns = read_dockerignore()
    for args in stages[0].all("COPY"):
        sources, _ = copy_sources(args)
        for src in sources:
            path = REPO / src
            assert path.exists(), f"COPY source {src} does not exist in the repository"
            for file in files_under(path):
                rel = file.relative_to(REPO).as_posix()
                assert dockerignore_allows(rel, patterns), f"{rel} is excluded by .dockerignore"
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        ".pg/data/PG_VERSION",
        "tests/unit/x.py",
        "detector/__pycache__/cli.cpython-312.pyc",
    ):
        assert not dockerignore_allows(unwanted, patterns), f"{unwanted} would reach the build context"


REQUIREMENTS = REPO / "deploy" / "docker" / "requirements.txt"
BUILD_SCRIPT = REPO / "deploy" / "docker" / "build.sh"


def test_oci_labels_carry_version_revision_and_source(stages: list[Stage]) -> None:
    """The final image is labelled with its version (pyproject's by default), git revision and source."""
    import tomllib

    final = stages[-1]
    labels = parse_env(" ".join(final.all("LABEL")))
    for key, arg in (("version", "VERSION"), ("revision", "REVISION"), ("source", "SOURCE")):
        assert labels[f"org.opencontainers.image.{key}"] == "${" + arg + "}"
    defaults = dict(a.split("=", 1) for a in final.all("ARG"))
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert defaults["VERSION"] == version, "ARG VERSION follows pyproject.toml's version"


def test_image_dependencies_are_locked_with_hashes() -> None:
    """Every pyproject dependency is pinned (==) within its range, every pin has sha256 hashes, and the
    image installs them with --require-hashes."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = REQUIREMENTS.read_text()
    logical = re.sub(r"\\\n\s*", " ", text)
    pins: dict[str, str] = {}
    for line in logical.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, _, hashes = line.partition(" --hash=")
        name, _, version = spec.split(";")[0].strip().partition("==")
        assert version, f"not pinned: {line}"
        assert hashes.startswith("sha256:"), f"no hash: {line}"
        pins[canonicalize_name(name)] = version
    for dependency in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(dependency)
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"{requirement.name} is not in {REQUIREMENTS.name}: regenerate it"
        assert requirement.specifier.contains(pinned), f"{requirement.name}=={pinned} outside {requirement.specifier}"
    assert "--require-hashes" in INSTALL_SCRIPT.read_text()


def test_build_script_tags_by_the_documented_scheme() -> None:
    """deploy/docker/build.sh: <version>-<commit>[-dirty] off a release tag, labels from git."""
    result = subprocess.run(
        ["sh", str(BUILD_SCRIPT), "--print", "registry.example.com/airflow-dupguard"],
        capture_output=True,
        text=True,
        check=True,
    )
    revision = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    argv = result.stdout.split()
    assert f"REVISION={revision.stdout.strip()}" in argv
    tag = argv[argv.index("--tag") + 1]
    assert re.fullmatch(r"registry\.example\.com/airflow-dupguard:\d+\.\d+\.\d+(-[0-9a-f]{12}(-dirty)?)?", tag), tag
    assert not tag.endswith(":latest")
    assert (
        subprocess.run([require_executable("shellcheck"), "--shell=sh", str(BUILD_SCRIPT)], check=False).returncode == 0
    )


def test_build_script_prints_its_command_without_git_or_docker(tmp_path: Path) -> None:
    """An unpacked sdist on a machine with neither git nor docker: --print still answers, with the
    <version>-nogit tag (nothing proves such a tree is the release) and an unknown revision."""
    import tomllib

    tree = tmp_path / "tree"
    (tree / "deploy" / "docker").mkdir(parents=True)
    shutil.copy2(REPO / "pyproject.toml", tree / "pyproject.toml")
    shutil.copy2(BUILD_SCRIPT, tree / "deploy" / "docker" / "build.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "dirname"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())  # the interpreter, not a pyenv shim
    result = subprocess.run(
        ["sh", str(tree / "deploy" / "docker" / "build.sh"), "--print", "registry.example.com/airflow-dupguard"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    argv = result.stdout.split()
    assert argv[:2] == ["docker", "build"]
    assert argv[argv.index("--tag") + 1] == f"registry.example.com/airflow-dupguard:{version}-nogit"
    assert "REVISION=unknown" in argv
    assert f"VERSION={version}" in argv
