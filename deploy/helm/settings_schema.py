"""Writes the companion chart's `config` and `secretKeyRefs` schema from dupguard's table of settings.

    python deploy/helm/settings_schema.py          # rewrite deploy/helm/dupguard/values.schema.json
    python deploy/helm/settings_schema.py --check  # exit 1 if it is out of date (tests/deploy does this)

``detector.config.SETTINGS`` is the one list of what `dupguard run` reads. Every setting reaches the pod
through a chart value in both modes: its own value (CHART_VALUES: `log.level`, `slack.channel`, ...),
the `config` map (every other non-secret setting, by its environment variable name) or `secretKeyRefs`
(every secret setting, from a key of any Secret). A setting added to SETTINGS lands in `config` or
`secretKeyRefs` when this script runs again, so none can be forgotten. Each `config` entry gets a schema
from how dupguard parses it: a choice's values, a duration's or a number's form, a URL's scheme.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from detector import config, settings

SCHEMA = Path(__file__).resolve().parent / "dupguard" / "values.schema.json"

# Settings with a chart value of their own, and that value (docs/how-to/deploy-kubernetes.md). They are not in `config`:
# one setting, one place to set it.
CHART_VALUES = {
    "DUPGUARD_SOURCE": "source",
    "DUPGUARD_DATABASE_URL": "database.metadataSecret",
    "DUPGUARD_LOCK_MODE": "database.lockMode",
    "DUPGUARD_POLL_INTERVAL": "pollInterval",
    "DUPGUARD_HTTP_PORT": "http.port",
    "DUPGUARD_CLUSTER_NAME": "clusterName",
    "DUPGUARD_DAGS": "dags",
    "DUPGUARD_EXCLUDE_DAGS": "excludeDags",
    "DUPGUARD_LEDGER": "ledger",
    "DUPGUARD_LOG_LEVEL": "log.level",
    "DUPGUARD_LOG_FORMAT": "log.format",
    "DUPGUARD_REMEDIATION": "remediation.mode",
    "DUPGUARD_REMEDIATION_BACKEND": "remediation.backend",
    "DUPGUARD_REMEDIATE_STARTED": "remediation.remediateStarted",
    "DUPGUARD_AIRFLOW_API_URL": "airflow.apiUrl",
    "DUPGUARD_AIRFLOW_UI_URL": "airflow.uiUrl",
    "DUPGUARD_AIRFLOW_USERNAME": "airflow.username",
    "DUPGUARD_AIRFLOW_CA_BUNDLE": "airflow.caBundle",
    "DUPGUARD_SLACK_CHANNEL": "slack.channel",
    "DUPGUARD_STATE_FILE": "api.stateVolume",
    # Set by the chart: the ConfigMap the container reads and the one it expects.
    "DUPGUARD_CONFIG_SOURCE": "",
    "DUPGUARD_CONFIG_EXPECTED": "",
}
# Not secret to dupguard, but an operator may keep them with the password: also from secretKeyRefs.
SECRET_KEY_REF_EXTRAS = ("DUPGUARD_AIRFLOW_USERNAME", "DUPGUARD_ALERTMANAGER_USERNAME")

# parse_duration: a bare 0, or numbers each with a unit (1h30m), in any letter case.
_DURATION = r"^\s*(0|([0-9]+(\.[0-9]+)?([mM][sS]|[sSmMhHdDwW]))+)\s*$"


def _any_case(word: str) -> str:
    """A regex for ``word`` in any letter case (dupguard lowercases choices and durations; JSON Schema
    patterns have no case-insensitive flag)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else ("\\" + c if c in ".+" else c) for c in word)


def _choices(setting: settings.Setting) -> tuple[str, ...] | None:
    """The values of a ``settings.choice(...)`` setting, else None."""
    return setting.parse.allowed if isinstance(setting.parse, settings.Choice) else None


def value_schema(setting: settings.Setting) -> dict[str, Any]:
    """The JSON Schema of one `config` entry, from the setting's parser and default."""
    help_text = f"{setting.env}: {setting.help} Default: {config.format_value(setting.default)}."
    default = setting.default
    allowed = _choices(setting)
    if allowed is not None:
        pattern = "|".join(_any_case(word) for word in allowed)
        return {"type": "string", "pattern": f"^\\s*({pattern})\\s*$", "description": help_text}
    if isinstance(default, bool):
        words = "|".join(_any_case(w) for w in ("1", "true", "yes", "on", "0", "false", "no", "off"))
        return {"type": ["boolean", "string"], "pattern": f"^\\s*({words})\\s*$", "description": help_text}
    if isinstance(default, int):
        return {"type": ["integer", "string"], "pattern": r"^\s*[-+]?[0-9]+\s*$", "description": help_text}
    if isinstance(default, timedelta):
        return {"type": "string", "pattern": _DURATION, "description": help_text}
    if isinstance(default, tuple):
        return {
            "type": ["string", "array"],
            "items": {"type": "string", "minLength": 1},
            "description": help_text + " A comma-separated string or a list.",
        }
    if setting.parse in (settings.url, settings.urls):
        return {"type": "string", "pattern": "^(https?://.*)?$", "description": help_text}
    return {"type": "string", "description": help_text}


def config_schema() -> dict[str, Any]:
    """`config`: every non-secret setting without a chart value of its own."""
    settings = [s for s in config.SETTINGS if not s.secret and s.env not in CHART_VALUES]
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "Every other setting of `dupguard run` by its environment variable name, in the "
        "ConfigMap both modes read (generated by deploy/helm/settings_schema.py from detector/config/table.py). "
        "Secrets: secretKeyRefs.",
        "properties": {s.env: value_schema(s) for s in settings},
    }


def secret_key_ref_names() -> list[str]:
    """The settings `secretKeyRefs` may set: every secret one, and the usernames."""
    names = [s.env for s in config.SETTINGS if s.secret or s.env in SECRET_KEY_REF_EXTRAS]
    return names


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(schema))
    out["properties"]["config"] = config_schema()
    out["properties"]["secretKeyRefs"]["propertyNames"]["enum"] = secret_key_ref_names()
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    current = SCHEMA.read_text()
    fresh = render(generated(json.loads(current)))
    if "--check" in argv:
        if fresh != current:
            print(f"{SCHEMA} is out of date: run python deploy/helm/settings_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
