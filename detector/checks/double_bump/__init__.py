"""Task attempts bumped twice (apache/airflow#57618, Airflow 3.0/3.1): ``rule`` (pure), ``statements``
(its tables and reads), ``settings`` and ``check`` (the class).

Light: importing the package imports its settings only (detector/checks/registry.py says why).
"""

from __future__ import annotations

from detector.checks.double_bump.settings import SETTINGS
from detector.checks.kind import Kind

ENTRY = Kind.of(__name__, SETTINGS)
