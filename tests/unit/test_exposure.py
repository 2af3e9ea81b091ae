"""``detector.core.exposure``: which code paths of which Airflow release can duplicate (the releases'
own record, docs/explanation/airflow-internals.md, "Which releases carry which fix"), and when a deployment is at risk
without protection."""

from __future__ import annotations

import pytest

from detector.core.exposure import (
    Observed,
    PathName,
    Status,
    assess,
    assess_family,
    family_affected,
    parse_version,
    release_affected,
    unprotected,
)

ASSET, PART, SPLIT = PathName.ASSET, PathName.PARTITIONED, PathName.SPLIT


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.10.5", {ASSET: False, PART: False, SPLIT: False}),
        ("3.0.0", {ASSET: True, PART: False, SPLIT: False}),
        ("3.0.6", {ASSET: True, PART: False, SPLIT: False}),
        ("3.1.8", {ASSET: True, PART: False, SPLIT: False}),  # the last 3.1: the backport came after it
        ("3.2.0", {ASSET: False, PART: True, SPLIT: True}),
        ("3.2.2", {ASSET: False, PART: True, SPLIT: True}),
        ("3.3.0", {ASSET: False, PART: False, SPLIT: True}),
        ("3.3.2", {ASSET: False, PART: False, SPLIT: True}),
        ("3.3.3", {ASSET: False, PART: False, SPLIT: None}),  # newer than the releases read: not assumed fixed
        ("3.4.0", {ASSET: False, PART: False, SPLIT: None}),
        (">=3.1.0,<3.1.8", {ASSET: True, PART: False, SPLIT: False}),  # an alembic head's range
        ("3.2 (inferred from columns)", {ASSET: False, PART: True, SPLIT: True}),
    ],
)
def test_the_version_table(version: str, expected: dict[PathName, bool | None]) -> None:
    parsed = parse_version(version)
    assert parsed is not None
    assert {name: release_affected(name, parsed)[0] for name in PathName} == expected


def test_two_schedulers_and_asset_dags_put_3_1_at_risk_and_one_scheduler_does_not() -> None:
    two = {r.name: r for r in assess(Observed("3.1.2", schedulers_alive=2, asset_dags=3, partitioned_dags=0))}
    assert two[ASSET].status is Status.AT_RISK
    assert [r.name for r in unprotected(list(two.values()))] == [ASSET]
    one = {r.name: r for r in assess(Observed("3.1.2", schedulers_alive=1, asset_dags=3, partitioned_dags=0))}
    assert one[ASSET].status is Status.NOT_EXPOSED
    assert unprotected(list(one.values())) == []


def test_duplicates_found_mean_at_risk_whatever_is_alive_now() -> None:
    seen = Observed("3.2.2", schedulers_alive=1, asset_dags=1, partitioned_dags=1, partitioned_groups_found=2)
    risks = {r.name: r for r in assess(seen)}
    assert risks[PART].status is Status.AT_RISK
    assert "2 duplicate group(s) found" in risks[PART].why


def test_what_could_not_be_read_is_unknown_and_not_ruled_out() -> None:
    risks = {r.name: r for r in assess(Observed("3.1.2"))}
    assert risks[ASSET].status is Status.UNKNOWN
    assert [r.name for r in unprotected(list(risks.values()))] == [ASSET]


@pytest.mark.parametrize("guard_notes, acts", [(1, False), (0, True)])
def test_the_guard_or_an_acting_remediation_protects_races_but_never_a_split(guard_notes: int, acts: bool) -> None:
    seen = Observed(
        "3.2.2",
        schedulers_alive=2,
        partitioned_dags=1,
        multi_asset_partitioned_dags=1,
        guard_notes=guard_notes,
        remediation_acts=acts,
    )
    risks = {r.name: r for r in assess(seen)}
    assert risks[PART].protected and risks[PART].status is Status.AT_RISK
    assert not risks[SPLIT].protected
    assert [r.name for r in unprotected(list(risks.values()))] == [SPLIT]


def test_a_split_needs_no_second_scheduler() -> None:
    """Two event registrations race (docs/explanation/airflow-internals.md, "A partition key split into two pending
    rows"), not two schedulers."""
    seen = Observed("3.3.2", schedulers_alive=1, partitioned_dags=1, multi_asset_partitioned_dags=1)
    assert {r.name: r.status for r in assess(seen)}[SPLIT] is Status.AT_RISK


def test_airflow_2_is_never_at_risk() -> None:
    assert unprotected(assess(Observed("2.10.5"))) == []
    assert {r.status for r in assess(Observed("2.10.5"))} == {Status.NOT_AFFECTED}


def test_an_unreadable_version_is_unknown() -> None:
    assert parse_version("unknown") is None
    assert {r.status for r in assess(Observed("unknown"))} == {Status.UNKNOWN}


# --- the rest of the family (docs/explanation/checks.md): named, watched, never in the verdict ---------------------


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.10.5", {"trigger_flapping": False, "stranded_events": False, "double_bump": False}),
        ("3.0.6", {"trigger_flapping": True, "stranded_events": True, "double_bump": True}),
        ("3.1.8", {"trigger_flapping": True, "stranded_events": True, "double_bump": True}),
        ("3.2.0", {"trigger_flapping": True, "stranded_events": True, "double_bump": False}),
        ("3.2.2", {"trigger_flapping": True, "stranded_events": True, "double_bump": False}),  # callback triggers
        ("3.3.2", {"trigger_flapping": True, "stranded_events": True, "double_bump": False}),
        ("3.3.3", {"trigger_flapping": None, "stranded_events": None, "double_bump": None}),
    ],
)
def test_the_familys_version_table(version: str, expected: dict[str, bool | None]) -> None:
    found = {r.name: r.affected for r in assess_family(Observed(version=version))}
    assert found == expected


def test_asset_triggers_are_named_before_3_2_2_and_callback_triggers_after() -> None:
    before = family_affected("trigger_flapping", (3, 2, 1))[1]
    after = family_affected("trigger_flapping", (3, 2, 2))[1]
    assert "asset triggers" in before and "asset triggers" not in after and "callback" in after


def test_family_exposure_and_watching() -> None:
    seen = Observed(
        version="3.1.2", triggerers_alive=2, schedulers_alive=1, asset_dags=3, checks_on=("stranded_events",)
    )
    risks = {r.name: r for r in assess_family(seen)}
    assert risks["trigger_flapping"].status is Status.AT_RISK and not risks["trigger_flapping"].watched
    assert risks["double_bump"].status is Status.NOT_EXPOSED  # one scheduler
    assert risks["stranded_events"].status is Status.AT_RISK and risks["stranded_events"].watched
    assert "does not run here" in risks["trigger_flapping"].why and "watches for it" in risks["stranded_events"].why
    quiet = {r.name: r.status for r in assess_family(Observed(version="3.1.2", triggerers_alive=1, asset_dags=0))}
    assert quiet == {"trigger_flapping": Status.NOT_EXPOSED, "stranded_events": Status.NOT_EXPOSED,
                     "double_bump": Status.UNKNOWN}  # fmt: skip
    assert assess(seen) == assess(Observed(version="3.1.2", schedulers_alive=1, asset_dags=3))  # not in the verdict
