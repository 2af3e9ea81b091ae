"""Reading the settings: flags > env (``DUPGUARD_*``, or a ``_FILE`` for secrets) > YAML file > defaults.

Validation collects every problem before failing, so an operator fixes them in one go, and never
shows a secret value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from detector import redact as _redact
from detector.checks.registry import KINDS as CHECK_KINDS
from detector.config.cross_checks import cross_checks
from detector.config.model import Config
from detector.config.table import API_POLL_INTERVAL, SETTINGS, SETTINGS_BY_NAME
from detector.errors import ConfigError
from detector.metadb.engine import parse_url
from detector.settings import ENV_PREFIX, Setting


def load(
    flags: Mapping[str, str | None] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
    sources: dict[str, str] | None = None,
) -> Config:
    """Build the Config; raises ConfigError listing every problem (never a secret value).

    ``disabled_checks`` may name only the periodic checks that exist (``detector.checks.registry.KINDS``).

    ``sources``, when given, receives where each setting came from (flag, env var, file, default).
    """
    flags = flags or {}
    sources = {} if sources is None else sources
    env = os.environ if env is None else env
    problems: list[str] = []
    file_values: dict[str, Any] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        file_values = _read_file(Path(path), problems)

    values: dict[str, Any] = {}
    for s in SETTINGS:
        raw, origin = _raw_value(s, flags, env, file_values, problems)
        sources[s.name] = origin
        if raw is None:
            values[s.name] = s.default
            continue
        try:
            values[s.name] = s.parse(raw)
        except ConfigError as exc:
            problems.extend(f"{origin}: {p}" for p in exc.problems)
        except (ValueError, TypeError, OverflowError) as exc:
            shown = "(hidden)" if s.secret else repr(_redact.cap(_redact.userinfo(raw), 81))
            problems.append(f"{origin}: invalid value {shown}: {exc}" if not s.secret else f"{origin}: invalid value")

    if values.get("source") == "api" and sources.get("poll_interval") == "default":
        values["poll_interval"] = API_POLL_INTERVAL  # a 10 ms HTTP poll would be 6,000 requests a minute
    problems.extend(_as_given(p, sources) for p in cross_checks(values))
    unknown = [k for k in values.get("disabled_checks", ()) if k not in CHECK_KINDS]
    if unknown:
        problems.append(
            f"{sources['disabled_checks']}: unknown check {', '.join(unknown)} (known: {', '.join(CHECK_KINDS)})"
        )
    if problems:
        raise ConfigError(problems)
    return Config(**values)


def _as_given(problem: str, sources: Mapping[str, str]) -> str:
    """A problem that names a setting by its env var names the flag instead when a flag set it: the
    user reads what they typed (``--remediation=fail``, not ``DUPGUARD_REMEDIATION=fail``)."""

    def named(match: re.Match[str]) -> str:
        setting = SETTINGS_BY_NAME.get(match[0][len(ENV_PREFIX) :].lower())
        return setting.flag if setting is not None and sources.get(setting.name) == setting.flag else match[0]

    return re.sub(ENV_PREFIX + r"[A-Z0-9_]+", named, problem)


def _read_file(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        problems.append(f"config file {path}: cannot read ({exc.strerror or type(exc).__name__})")
        return {}
    except UnicodeDecodeError:
        problems.append(f"config file {path}: not UTF-8 text")
        return {}
    except ValueError:  # a NUL byte in the path
        problems.append("config file: the path is not a valid file name")
        return {}
    except yaml.YAMLError as exc:
        problems.append(f"config file {path}: not valid YAML ({exc.__class__.__name__})")
        return {}
    except RecursionError:  # PyYAML recurses once per level: a few hundred nested [ or { exhaust the stack
        problems.append(f"config file {path}: nested too deeply (expected a mapping of setting: value)")
        return {}
    if not isinstance(data, dict):
        problems.append(f"config file {path}: must be a mapping of setting: value")
        return {}
    unknown = sorted(repr(k) for k in data if k not in SETTINGS_BY_NAME)
    problems.extend(f"config file {path}: unknown setting {k}" for k in unknown)
    return {k: v for k, v in data.items() if k in SETTINGS_BY_NAME}


def _raw_value(
    s: Setting,
    flags: Mapping[str, str | None],
    env: Mapping[str, str],
    file_values: Mapping[str, Any],
    problems: list[str],
) -> tuple[str | None, str]:
    if flags.get(s.name) is not None:
        return str(flags[s.name]), s.flag
    if env.get(s.env) not in (None, ""):
        return env[s.env], s.env
    file_env = s.env + "_FILE"
    if s.secret and env.get(file_env):
        try:
            return Path(env[file_env]).read_text(encoding="utf-8").strip(), file_env
        except OSError as exc:
            problems.append(f"{file_env}: cannot read {env[file_env]} ({exc.strerror or type(exc).__name__})")
        except UnicodeDecodeError:
            problems.append(f"{file_env}: {env[file_env]} is not UTF-8 text")
        except ValueError:
            problems.append(f"{file_env}: not a valid file name")
        return None, file_env
    if s.name in file_values and file_values[s.name] is not None:
        value = file_values[s.name]
        if isinstance(value, list):
            value = ",".join(map(str, value))
        elif isinstance(value, dict):
            problems.append(f"config file key {s.name}: expected a single value, not a mapping")
            return None, f"config file key {s.name}"
        return str(value), f"config file key {s.name}"
    return None, "default"


def database_url(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """The database URL the way ``run`` reads it (flag > env > ``_FILE``), for ``scan`` and ``init-db``."""
    env = os.environ if env is None else env
    problems: list[str] = []
    raw, origin = _raw_value(SETTINGS_BY_NAME["database_url"], {"database_url": flag}, env, {}, problems)
    if problems:
        raise ConfigError(problems)
    if raw is None:
        raise ConfigError(["--database-url, DUPGUARD_DATABASE_URL or DUPGUARD_DATABASE_URL_FILE is required"])
    try:
        parse_url(raw)
    except ConfigError as exc:
        raise ConfigError([f"{origin}: {p}" for p in exc.problems]) from None
    return raw


def flag_names() -> Sequence[str]:
    return [s.flag for s in SETTINGS]
