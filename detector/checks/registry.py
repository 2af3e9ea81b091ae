"""The periodic checks that exist: one line per kind in ``REGISTERED``, nowhere else.

A kind is a package ``detector/checks/<kind>/`` (docs/explanation/checks.md): its pure ``rule``, its ``statements``,
its ``settings``, its ``check`` (the ``CheckBase`` class, exported as ``CHECK``) and whatever else only it
uses (an alert text, a repair step). Its light ``__init__`` declares ``ENTRY = Kind.of(__name__, SETTINGS)``
and imports nothing but its settings, so this module sits low: ``detector.config`` reads every kind's
settings here (``SETTINGS``, spliced into its own in this order), and ``detector.checks.enabled`` (above
the actions and the database layer) loads each kind's check class from ``Kind.check_module``.

Why ``importlib`` there and not a plain import table: this module cannot import the check classes (they
sit above the database layer, and config imports this module), so a table of
``from detector.checks.<kind>.check import CHECK`` lines would live in ``enabled`` as a second line per
kind, kept in step with this one by hand. Loading by the module name the entry already carries keeps
registering a kind one line; ``enabled`` checks each loaded class is its kind's ``CheckBase``. The order
below is the order of the settings in ``--help`` and docs/reference/settings.md, and the order the checks
run in ``scan``.
"""

from __future__ import annotations

from detector.checks import double_bump, split_partition, stranded_events, trigger_flapping
from detector.checks.kind import Kind
from detector.settings import Setting

REGISTERED: tuple[Kind, ...] = (
    split_partition.ENTRY,
    stranded_events.ENTRY,
    double_bump.ENTRY,
    trigger_flapping.ENTRY,
)
KINDS = tuple(k.name for k in REGISTERED)
SETTINGS: tuple[Setting, ...] = tuple(s for k in REGISTERED for s in k.settings)
