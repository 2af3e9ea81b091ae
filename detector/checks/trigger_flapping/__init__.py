"""Triggers claimed by every triggerer, and their id-less copies: ``rule`` and ``rule_copies`` (pure),
``statements`` (its tables and reads), ``settings`` and ``check`` (the class, with its observations' text).

Light: importing the package imports its settings only (detector/checks/registry.py says why).
"""

from __future__ import annotations

from detector.checks.kind import Kind
from detector.checks.trigger_flapping.settings import SETTINGS

ENTRY = Kind.of(__name__, SETTINGS)
