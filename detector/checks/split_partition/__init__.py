"""Split partition keys (apache/airflow#71070, Airflow 3.2+): ``rule`` (pure), ``statements`` (its reads),
``settings``, ``alert`` (its richer message) and ``check`` (the class).

Light: importing the package imports its settings only (detector/checks/registry.py says why).
"""

from __future__ import annotations

from detector.checks.kind import Kind
from detector.checks.split_partition.settings import SETTINGS

ENTRY = Kind.of(__name__, SETTINGS)
