"""Asset events that trigger nothing (apache/airflow#56050): ``rule``, ``rule_late`` and ``rule_repair`` (pure),
``statements`` (its reads and the queue row's write), ``settings``, ``copies`` (a trigger's copies among the
stranded events), ``check`` (the class), its repair step ``repair`` and the fenced write ``requeue``.

Light: importing the package imports its settings and metrics only (detector/checks/registry.py says why).
"""

from __future__ import annotations

from detector.checks.kind import Kind
from detector.checks.stranded_events import metrics
from detector.checks.stranded_events.settings import SETTINGS

ENTRY = Kind.of(__name__, SETTINGS, metrics.register)
