"""The Slack bot keeps a group's thread in the durable ledger (``notes``). With that table dropped under
it, on a real PostgreSQL with the Airflow 3.1.2 schema, a group's outcome still goes out (unthreaded,
as when no one knows the thread), instead of failing on the ledger it cannot read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy.engine import make_url

from detector.actions.alerts.channels.slack_bot import SlackBot, SlackBotChannel
from detector.actions.alerts.slack_clients import make_web_client
from detector.app.ledger import DbLedger, init_db
from detector.core.plan import Mode, Outcome
from detector.core.ports import AlertKind, RemediationResult, Result
from detector.metadb.engine import make_engine, parse_url
from tests.pg import Templates, execute_admin
from tests.slack_server import SlackServer
from tests.unit.test_slack_snapshots import _action, _event, _finding

pytestmark = pytest.mark.integration


@pytest.fixture
def slack() -> Iterator[SlackServer]:
    server = SlackServer()
    yield server
    server.stop()


def test_an_outcome_goes_out_unthreaded_when_the_ledgers_notes_are_gone(
    pg_templates: Templates, slack: SlackServer
) -> None:
    url = pg_templates.clone("3.1.2")
    engine = make_engine(parse_url(url))
    try:
        init_db(engine)
        client = make_web_client(slack.token, api_url=slack.api_url, timeout=5, on_retry=lambda: None)
        channel = SlackBotChannel(SlackBot(client, "#alerts"), DbLedger(engine))
        finding = _finding()
        execute_admin("DROP TABLE dupguard.notes", dbname=str(make_url(url).database))
        channel.detected(_event(finding))  # posted; its thread cannot be remembered
        result = RemediationResult(_action(finding, Outcome.REMEDIATE, Mode.FAIL), Result.DONE, "")
        channel.outcome(replace(_event(finding), kind=AlertKind.OUTCOME, results=(result,)))
    finally:
        engine.dispose()
    assert len(slack.top_level()) == 2, "the detection and, unthreaded, its outcome"
