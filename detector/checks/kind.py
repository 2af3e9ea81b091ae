"""A registered kind of periodic check, as the low modules see it: its name and its own settings.

Each kind's package ``__init__`` declares one ``Kind`` (``ENTRY``) from its ``settings`` module alone, so
``detector.config`` gathers every kind's settings through ``detector.checks.registry`` without importing a
check class. The kind's name is its package's name; its check class is ``CHECK`` in the package's
``check`` module (``detector.checks.enabled`` loads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from detector.settings import Setting


@dataclass(frozen=True)
class Kind:
    name: str  # the check's ``kind``: DUPGUARD_DISABLED_CHECKS, metric labels, observation keys
    settings: tuple[Setting, ...] = ()

    @classmethod
    def of(cls, package: str, settings: tuple[Setting, ...] = ()) -> Kind:
        """The kind of the package named ``package`` (a kind's ``__init__`` passes its ``__name__``)."""
        return cls(package.rpartition(".")[2], settings)

    @property
    def check_module(self) -> str:
        return f"detector.checks.{self.name}.check"
