"""A registered kind of periodic check, as the low modules see it: its name, its own settings and metrics.

Each kind's package ``__init__`` declares one ``Kind`` (``ENTRY``) from its ``settings`` module alone, so
``detector.config`` gathers every kind's settings through ``detector.checks.registry`` without importing a
check class. The kind's name is its package's name; its check class is ``CHECK`` in the package's
``check`` module (``detector.checks.enabled`` loads it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from detector.settings import Setting

# registers the kind's own metrics on one daemon's registry; what it returns is ``Metrics.of_kind``'s
Register = Callable[[CollectorRegistry], object]


@dataclass(frozen=True)
class Kind:
    name: str  # the check's ``kind``: DUPGUARD_DISABLED_CHECKS, metric labels, observation keys
    settings: tuple[Setting, ...] = ()
    metrics: Register | None = None  # its own metrics, if any (detector/checks/<kind>/metrics.py)

    @classmethod
    def of(cls, package: str, settings: tuple[Setting, ...] = (), metrics: Register | None = None) -> Kind:
        """The kind of the package named ``package`` (a kind's ``__init__`` passes its ``__name__``)."""
        return cls(package.rpartition(".")[2], settings, metrics)

    @property
    def check_module(self) -> str:
        return f"detector.checks.{self.name}.check"
