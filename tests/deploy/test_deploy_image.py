"""The container image: Dockerfile lint, build context, and the install steps replayed without Docker.

No Docker engine runs here, so ``test_builder_stage_installs_a_working_dupguard`` reads the
Dockerfile's builder stage and replays it instruction by instruction (WORKDIR, ENV, COPY, RUN) in a
temporary directory, with the venv path as the only substitution, then runs the ``dupguard``
entrypoint from the result the way the final stage would. The RUN lines only call
``deploy/docker/install.sh``, so what is tested here is what the image runs.
"""

from __future__ import annotations

import os
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


def image_python() -> str:
    """The interpreter for the replay: a Python 3.12 like the image's base when one runs, else ours."""
    candidates = [os.environ.get("DUPGUARD_IMAGE_TEST_PYTHON"), shutil.which("python3.12")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv_root.glob("versions/3.12*/bin/python3.12"))]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0:
            return probe.stdout.strip()
    return sys.executable


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


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    }


@pytest.mark.timeout(900)
def test_builder_stage_installs_a_working_dupguard(stages: list[Stage], tmp_path: Path) -> None:
    """Replaying the builder stage yields a venv whose `dupguard` runs, and running it writes nothing."""
    builder, final = stages
    workdir: Path | None = None
    patterns = read_dockerignore()
    venv_in_image = parse_env(" ".join(builder.all("ENV")))["DUPGUARD_VENV"]
    venv = tmp_path / venv_in_image.lstrip("/")
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    env["PYTHON"] = image_python()

    for instruction in builder.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = tmp_path / instruction.args.lstrip("/")
            workdir.mkdir(parents=True)
        elif instruction.keyword == "ENV":
            env.update(parse_env(instruction.args))
            env["DUPGUARD_VENV"] = str(venv)  # the one substitution: the venv lives under tmp_path
        elif instruction.keyword == "COPY":
            assert workdir is not None
            sources, dest = copy_sources(instruction.args)
            for src in sources:
                root = REPO / src
                for file in files_under(root):
                    rel = file.relative_to(REPO).as_posix()
                    if not dockerignore_allows(rel, patterns):
                        continue  # not in the build context, so not in the image either
                    if root.is_dir():
                        target = workdir / dest / file.relative_to(root)
                    elif dest.endswith("/"):
                        target = workdir / dest / file.name
                    else:
                        target = workdir / dest
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, target)
        elif instruction.keyword == "RUN":
            assert workdir is not None
            result = subprocess.run(
                ["sh", "-c", instruction.args],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=800,
            )
            assert result.returncode == 0, f"RUN {instruction.args} failed:\n{result.stdout}\n{result.stderr}"
        elif instruction.keyword not in {"ARG", "LABEL"}:
            pytest.fail(f"the replay does not know builder instruction {instruction.keyword}")

    entrypoint = venv / "bin" / "dupguard"
    assert entrypoint.is_file(), "the builder venv has no dupguard console script"

    # Run it as the final stage would: its ENV, outside any source tree, without .pyc writes.
    run_env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    run_env.update({k: v for k, v in parse_env(" ".join(final.all("ENV"))).items() if k != "PATH"})
    run_env["HOME"] = run_env["TMPDIR"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir()
    before = snapshot(venv)
    outputs = []
    for argv in (["--help"], ["run", "--help"]):
        result = subprocess.run(
            [str(entrypoint), *argv],
            cwd=tmp_path / "home",
            env=run_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert result.returncode == 0, f"dupguard {' '.join(argv)}:\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    for command in ("run", "scan", "demo", "init-db", "guard"):
        assert command in outputs[0], f"`dupguard --help` does not list {command}"
    assert snapshot(venv) == before, "running dupguard wrote into the venv (read-only root filesystem)"
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import detector; print(detector.__file__)"],
        cwd=tmp_path / "home",
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip().startswith(str(venv)), "detector must come from the venv, not the repo"


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
