"""The state file of the api source (``FileLedger``): concurrent writers never break a poll or lose a
claim on disk, and a claim whose write failed is not taken (the retry must be able to take it)."""

from __future__ import annotations

import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from detector.app.ledger_file import FileLedger
from detector.core.ports import Observed
from detector.errors import LedgerError
from tests.full_volume import fill, small_volume


def test_threads_claiming_at_once_all_reach_the_file(tmp_path: Path) -> None:
    """The daemon claims from the poll thread, the remediation workers and the alert lanes at once:
    every save succeeds and the file ends with every claim (the e2e harness once lost a poll to a
    shared temp file renamed away by another thread)."""
    path = tmp_path / "state.json"
    ledger = FileLedger(str(path))
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(n: int) -> None:
        start.wait()
        try:
            for i in range(60):
                ledger.claim(f"group-{n}", f"subject-{i}")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    reread = FileLedger(str(path))
    assert all(not reread.claim(f"group-{n}", f"subject-{i}") for n in range(8) for i in range(60))


def test_a_claim_whose_write_failed_is_not_taken(tmp_path: Path) -> None:
    """The volume goes away: the claim raises, and once it is back the same claim is won (before, the
    claim stayed taken in memory, so the retried poll thought the group already alerted)."""
    folder = tmp_path / "volume"
    folder.mkdir()
    ledger = FileLedger(str(folder / "state.json"))
    shutil.rmtree(folder)
    with pytest.raises(LedgerError, match="cannot write"):
        ledger.claim_all("group", ["detected", "action:run-2"])
    with pytest.raises(LedgerError, match="cannot write"):
        ledger.claim("group", "alert:slack")
    folder.mkdir()
    assert ledger.claim_all("group", ["detected", "action:run-2"]) == {"detected", "action:run-2"}
    assert ledger.claim("group", "alert:slack")
    assert not FileLedger(str(folder / "state.json")).claim("group", "detected")


def test_a_full_volume_is_named_as_the_cause(tmp_path: Path) -> None:
    """On a really full filesystem a claim raises LedgerError whose first line (what a failed poll,
    /readyz and the log show) names the cause; it was "invalid configuration:" with the cause on a
    later line, dropped. Once space is freed the claim is taken."""
    with small_volume(tmp_path / "volume") as volume:
        ledger = FileLedger(str(volume / "state.json"))
        filler = fill(volume)
        with pytest.raises(LedgerError) as err:
            ledger.claim_all("group", ["detected", "x" * 8192])
        assert "No space left on device" in str(err.value).splitlines()[0]
        filler.unlink()
        assert ledger.claim_all("group", ["detected"]) == {"detected"}


def test_a_dry_run_observation_survives_a_restart_until_dropped(tmp_path: Path) -> None:
    """What a later mode fail or skip judges again: kept across restarts, gone once dropped."""
    path = tmp_path / "state.json"
    at = datetime(2026, 12, 7, 9, 30, 1, 250000, tzinfo=UTC)
    item = Observed("group|a", "consumer", "asset_triggered__x|y", "asset_triggered__k", at)
    FileLedger(str(path)).add_observed(item)
    restarted = FileLedger(str(path))
    assert restarted.observed() == [item]
    assert restarted.pending() == []
    restarted.drop_observed("consumer", "asset_triggered__x|y")
    assert FileLedger(str(path)).observed() == []
