"""The ledger of ``--source api``, which has no database to hold one: ``MemoryLedger`` kept in a JSON file."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from detector.app.ledger_memory import MemoryLedger, decision_rows, unique_claims, won_by_group
from detector.errors import ConfigError, LedgerError


class FileLedger(MemoryLedger):
    """``MemoryLedger`` kept in a JSON file on a volume (``DUPGUARD_STATE_FILE``, ``--source api``,
    which has no database to hold a ledger): written after every change by write-to-temp, fsync and
    rename, so a crash leaves the old or the new file, never half of one. Bounded like the memory
    ledger (``max_entries``), which bounds each write. One writer: the single-replica Deployment
    (``Recreate``) with a ReadWriteOnce volume; a second replica must not share the file.
    """

    durable = True

    def __init__(self, path: str, max_entries: int = 20_000) -> None:
        super().__init__(max_entries=max_entries)
        self.path = Path(path)
        # Poll thread, remediation workers and alert lanes save at once: one writer at a time, each
        # writing a snapshot taken after the previous write, so the file never goes back in time.
        self._write_lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            try:
                self._save()  # fail at start, not at the first claim, if the folder is not writable
            except LedgerError as exc:
                raise ConfigError([str(exc)]) from None
            return
        except (OSError, ValueError) as exc:
            raise ConfigError([f"DUPGUARD_STATE_FILE {self.path}: unreadable ({_reason(exc)})"]) from None
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ConfigError([f"DUPGUARD_STATE_FILE {self.path}: not a dupguard state file"])
        for group_key, subject in data.get("claims", []):
            self._claims[(group_key, subject)] = None
        for group_key, name, value in data.get("notes", []):
            self._notes[(group_key, name)] = value
        self._watermark = data.get("watermark")

    def _save(self) -> None:
        with self._write_lock:
            with self._lock:
                data = {
                    "version": 1,
                    "claims": [list(k) for k in self._claims],
                    "notes": [[*k, v] for k, v in self._notes.items()],
                    "watermark": self._watermark,
                }
            temp = self.path.with_name(self.path.name + ".tmp")
            try:
                with temp.open("w", encoding="utf-8") as out:
                    json.dump(data, out, separators=(",", ":"))
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, self.path)
            except OSError as exc:
                # the cause (e.g. "No space left on device") is the message's point: never dropped
                raise LedgerError(f"DUPGUARD_STATE_FILE {self.path}: cannot write ({_reason(exc)})") from None

    def _claim_saved(self, rows: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Claims that hold only once written: if the write fails they are given back, so the retry
        of the same poll can take them (a claim kept in memory only would silence that group)."""
        won = [row for row in rows if MemoryLedger.claim(self, *row)]
        if won:
            try:
                self._save()
            except LedgerError:
                with self._lock:
                    for row in won:
                        self._claims.pop(row, None)
                raise
        return won

    def claim(self, group_key: str, subject: str) -> bool:
        return bool(self._claim_saved([(group_key, subject)]))

    def claim_all(self, group_key: str, subjects: list[str]) -> set[str]:
        return {subject for _, subject in self._claim_saved((group_key, s) for s in subjects)}

    def claim_groups(self, claims: Sequence[tuple[str, Sequence[str]]]) -> list[set[str]]:
        """Every group's claims, saved in one write."""
        return won_by_group(claims, set(self._claim_saved(unique_claims(claims))))

    def record_decision(self, kept: tuple[str, str], duplicates: Iterable[tuple[str, str]]) -> None:
        self._claim_saved(decision_rows(kept, duplicates))

    def record_decisions(self, judgements: Sequence[tuple[tuple[str, str], Sequence[tuple[str, str]]]]) -> None:
        self._claim_saved([row for kept, dups in judgements for row in decision_rows(kept, dups)])

    def remember(self, group_key: str, name: str, value: str) -> None:
        super().remember(group_key, name, value)
        self._save()

    def remember_many(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Every row, saved in one write."""
        for group_key, name, value in rows:
            MemoryLedger.remember(self, group_key, name, value)
        if rows:
            self._save()

    def save_watermark(self, high: int) -> None:
        super().save_watermark(high)
        self._save()

    def _forget(self, group_key: str, name: str) -> None:
        super()._forget(group_key, name)
        self._save()


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__
