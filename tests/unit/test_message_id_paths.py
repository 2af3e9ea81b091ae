"""A custom trigger's own message id (``message_id_paths``): the setting's syntax, refused at start-up when
wrong and naming the setting, and the ids it finds, which prove copies (and distinct messages) as the
providers' ids do (detector.core.trigger_event)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from detector import config
from detector.checks.trigger_flapping.rule_copies import suspected_copies
from detector.core.model import Confidence
from detector.core.trigger_event import IdPaths, copies, custom_ids, find_trigger_event_duplicates, trigger_event
from detector.errors import ConfigError
from detector.settings import format_value, message_id_paths
from tests.factories import T0, run

WINDOW = timedelta(seconds=60)
PATHS: IdPaths = (("orders", ("payload", "meta", "id")),)
CUSTOM = {"meta": {"id": "ord-7f3c2a91", "source": "orders-service"}, "body": {"order": 42}}


def extra(payload: object) -> dict[str, Any]:
    return {"from_trigger": True, "payload": payload}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("orders=payload.meta.id", PATHS),
        (" orders = payload.meta.id , ", PATHS),
        ("billing_*=payload.items.*.id", (("billing_*", ("payload", "items", "*", "id")),)),
        ("a=b=payload.id", (("a=b", ("payload", "id")),)),  # the pair splits at its last =
        ("orders=payload", (("orders", ("payload",)),)),  # the payload itself is the id
        ("orders=payload.id,customers=payload.key", (("orders", ("payload", "id")), ("customers", ("payload", "key")))),
        ("", ()),
    ],
)
def test_the_setting_reads_asset_path_pairs(text: str, parsed: IdPaths) -> None:
    assert message_id_paths(text) == parsed
    assert message_id_paths(format_value(parsed) if parsed else "") == parsed  # check-config's YAML reads back


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("payload.meta.id", "is not ASSET=PATH"),  # no asset
        ("=payload.meta.id", "is not ASSET=PATH"),
        ("orders=meta.id", "must start with payload"),  # the extra keeps the payload under payload
        ("orders=", "empty key"),
        ("orders=payload..id", "empty key"),
        ("orders=payload.id.", "empty key"),
        ("orders=payload. id", "spaces around"),
        ("orders=$.payload.meta.id", "not JSONPath"),
        ("orders=payload.items[0].id", "not JSONPath"),
        ("orders=payload.ite*.id", "stands alone"),
        ("orders=payload.id,orders=payload.key", "given two paths"),
    ],
)
def test_bad_paths_are_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        message_id_paths(text)


def test_a_bad_path_stops_the_start_naming_the_setting() -> None:
    env = {"DUPGUARD_DATABASE_URL": "sqlite:///x.db", "DUPGUARD_MESSAGE_ID_PATHS": "orders=meta.id"}
    with pytest.raises(ConfigError) as err:
        config.load({}, env)
    [problem] = err.value.problems
    assert problem.startswith("DUPGUARD_MESSAGE_ID_PATHS: invalid value 'orders=meta.id'")
    assert "must start with payload" in problem
    with pytest.raises(ConfigError, match="--message-id-paths: invalid value"):
        config.load({"message_id_paths": "orders=payload[0]"}, env | {"DUPGUARD_MESSAGE_ID_PATHS": ""})


def test_the_setting_reaches_the_config_from_flags_env_and_a_yaml_list(tmp_path: Any) -> None:
    base = {"DUPGUARD_DATABASE_URL": "sqlite:///x.db"}
    assert config.load({}, base).message_id_paths == ()
    assert config.load({"message_id_paths": "orders=payload.meta.id"}, base).message_id_paths == PATHS
    assert config.load({}, base | {"DUPGUARD_MESSAGE_ID_PATHS": "orders=payload.meta.id"}).message_id_paths == PATHS
    path = tmp_path / "dupguard.yaml"
    path.write_text("message_id_paths:\n  - orders=payload.meta.id\n  - billing_*=payload.id\n")
    loaded = config.load({}, base, str(path)).message_id_paths
    assert loaded == (*PATHS, ("billing_*", ("payload", "id")))


@pytest.mark.parametrize(
    ("payload", "asset", "ids"),
    [
        (CUSTOM, "orders", {"payload.meta.id:ord-7f3c2a91"}),
        (CUSTOM, "customers", set()),  # another asset: its payload may hold meta.id with another meaning
        ({"meta": {"id": 17}}, "orders", {"payload.meta.id:17"}),  # a whole number
        ({"meta": {"id": ""}}, "orders", set()),  # empty: no id
        ({"meta": {"id": True}}, "orders", set()),  # a bool is not an id
        ({"meta": {"id": 1.5}}, "orders", set()),  # nor a float
        ({"meta": {"id": {"x": 1}}}, "orders", set()),
        ({"meta": "ord-1"}, "orders", set()),  # a key below a string
        ({"body": {}}, "orders", set()),  # the key is missing
        ("ord-1", "orders", set()),
    ],
)
def test_custom_ids_at_the_named_path(payload: object, asset: str, ids: set[str]) -> None:
    assert custom_ids(extra(payload), asset, PATHS) == ids


def test_star_reads_every_item_of_a_list_and_globs_name_assets() -> None:
    paths: IdPaths = (("billing_*", ("payload", "items", "*", "id")), ("*", ("payload", "key")))
    payload = {"items": [{"id": "a"}, {"id": "b"}, {"no": "id"}, "x"], "key": 5}
    found = custom_ids(extra(payload), "billing_eu", paths)
    assert found == {"payload.items.*.id:a", "payload.items.*.id:b", "payload.key:5"}
    assert custom_ids(extra(payload), "orders", paths) == {"payload.key:5"}
    assert custom_ids(extra({"items": {"id": "a"}}), "billing_eu", paths[:1]) == set()  # * wants a list
    assert custom_ids(extra(payload), None, paths) == set()  # no asset name: nothing to match


def _event(event_id: int, seconds: float, payload: object, paths: IdPaths = PATHS, asset: str = "orders") -> Any:
    made = trigger_event(event_id, 1, T0 + timedelta(seconds=seconds), extra(payload), None, asset, paths)
    assert made is not None
    return made


def test_a_custom_id_proves_copies_and_confirms_the_group() -> None:
    """The Airflow-made trigger_event_custom_id: two copies of one message, one run each."""
    events = [_event(1, 0, CUSTOM), _event(2, 0.4, CUSTOM)]
    assert [c.proven for c in copies(events, WINDOW)] == [True]
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    [group] = find_trigger_event_duplicates([a, b], {10: frozenset({1}), 11: frozenset({2})}, copies(events, WINDOW))
    assert (group.confidence, group.kept.id, [r.id for r in group.duplicates]) == (Confidence.CONFIRMED, 10, [11])


def test_without_the_setting_the_same_events_prove_nothing() -> None:
    events = [_event(1, 0, CUSTOM, ()), _event(2, 0.4, CUSTOM, ())]
    assert [c.proven for c in copies(events, WINDOW)] == [False]
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    assert find_trigger_event_duplicates([a, b], {10: frozenset({1}), 11: frozenset({2})}, copies(events, WINDOW)) == []


def test_different_custom_ids_are_two_messages_even_with_equal_bodies() -> None:
    second = {**CUSTOM, "meta": {"id": "ord-0b9e", "source": "orders-service"}}
    assert copies([_event(1, 0, CUSTOM), _event(2, 0.4, second)], WINDOW) == []


def test_a_broadcast_payload_with_an_id_is_no_id_less_copy() -> None:
    """A Redis pub/sub message whose author put an id beside it: the id decides, not the equal payload."""
    redis = {"type": "message", "pattern": None, "channel": "orders", "data": "x", "meta": {"id": "m-1"}}
    events = [_event(1, 0, redis), _event(2, 0.4, {**redis, "meta": {"id": "m-2"}})]
    consumed = {10: frozenset({1}), 11: frozenset({2})}
    runs = [run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))]
    assert suspected_copies(events, WINDOW, consumed, runs, lambda _: True) == []
    id_less = [_event(1, 0, redis, ()), _event(2, 0.4, redis, ())]
    assert len(suspected_copies(id_less, WINDOW, consumed, runs, lambda _: True)) == 1
