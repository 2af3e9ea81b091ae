"""End-to-end harness hooks for Airflow processes (``tests/e2e/``); inert unless its env vars are set.

This directory is put on ``PYTHONPATH`` of the two **schedulers only** (their LocalExecutor workers
are forked from them, so they inherit it). Nothing here changes what Airflow decides; it only adds
time at two points, so the race and the remediation window can be studied:

* ``DUPGUARD_E2E_FAULT_MAX_MS`` (fault injection): ``SerializedDagModel.get_latest_serialized_dags``
  sleeps a random 0..MAX ms before it runs. In Airflow 3.0/3.1 that call sits between the unlocked
  ``asset_dag_run_queue`` read and the ``FOR NO KEY UPDATE SKIP LOCKED`` on ``dag``
  (airflow/models/dag.py ``DagModel.dags_needing_dagruns``, 3.1.2 L599 / L606 / L657), which is the
  window of apache/airflow#54491. Widening it raises the natural duplicate rate (a few % of events)
  so a short run sees enough duplicates. It is the scheduler's own code path, only slower.
* ``DUPGUARD_E2E_PICKUP_DELAY`` (seconds, worker pickup latency): the LocalExecutor worker sleeps
  this long after taking a task from the executor queue and before ``supervise()`` (which makes the
  Execution API ``ti_run`` call that moves the task instance QUEUED -> RUNNING). It stands in for the
  broker/worker latency of Celery or the pod start-up of Kubernetes. Only task instances of DAGs
  whose id starts with ``DUPGUARD_E2E_PICKUP_DAG_PREFIX`` (default ``consumer``) are delayed, so the
  producer keeps its pace.

Each hook wraps the function once, right after Airflow imports its module (a meta-path finder), so
it holds in processes forked later.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import random
import sys
import time
from typing import Any

_FAULT_MAX_MS = float(os.environ.get("DUPGUARD_E2E_FAULT_MAX_MS") or 0)
_PICKUP_DELAY = float(os.environ.get("DUPGUARD_E2E_PICKUP_DELAY") or 0)
_PICKUP_PREFIX = os.environ.get("DUPGUARD_E2E_PICKUP_DAG_PREFIX", "consumer")


def _patch_serialized_dag(module: Any) -> None:
    cls = module.SerializedDagModel
    original = cls.get_latest_serialized_dags.__func__

    def get_latest_serialized_dags(klass: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(random.uniform(0, _FAULT_MAX_MS) / 1000.0)
        return original(klass, *args, **kwargs)

    cls.get_latest_serialized_dags = classmethod(get_latest_serialized_dags)


def _patch_local_executor(module: Any) -> None:
    original = module._execute_work

    def _execute_work(log: Any, workload: Any) -> None:
        dag_id = getattr(getattr(workload, "ti", None), "dag_id", "") or ""
        if dag_id.startswith(_PICKUP_PREFIX):
            time.sleep(_PICKUP_DELAY)
        original(log, workload)

    module._execute_work = _execute_work


_PATCHES = {}
if _FAULT_MAX_MS > 0:
    _PATCHES["airflow.models.serialized_dag"] = _patch_serialized_dag
if _PICKUP_DELAY > 0:
    _PATCHES["airflow.executors.local_executor"] = _patch_local_executor


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, wrapped: Any, patch: Any) -> None:
        self.wrapped = wrapped
        self.patch = patch

    def create_module(self, spec: Any) -> Any:
        return self.wrapped.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.wrapped.exec_module(module)
        self.patch(module)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


if _PATCHES:
    sys.meta_path.insert(0, _PatchingFinder())
