"""The Airflow permission each REST call needs, named in the one-line error a 403 becomes.

Airflow answers a missing permission with a bare ``403 Forbidden`` (core_api/security.py), so the
caller says what it asked for. Read in Airflow 3.1.2's routes (``requires_access_dag`` /
``requires_access_asset``) and the auth managers:
- FAB (providers/fab ``FabAuthManager.is_authorized_dag``): a DAG sub-entity needs the method on
  the DAG (read for GET, edit otherwise; "DAGs" or the single "DAG:<dag_id>") and on the entity:
  DAG Runs for runs; DAG Runs and Task Instances for task instances. Assets: "Assets".
- simple auth manager (simple_auth_manager.py ``is_authorized_dag``/``is_authorized_asset``):
  any GET needs role viewer; editing a DAG's runs or task instances needs role user.
"""

from __future__ import annotations


def _needs(fab: str, role: str) -> str:
    return f"{fab} (FAB auth manager; or role {role} or higher with the simple auth manager)"


READ_RUNS = _needs('"can read" on DAGs and DAG Runs', "viewer")
READ_TASK_INSTANCES = _needs('"can read" on DAGs, DAG Runs and Task Instances', "viewer")
READ_ASSET_EVENTS = _needs('"can read" on Assets, DAGs and DAG Runs', "viewer")
EDIT_RUNS = _needs('"can edit" on DAGs and DAG Runs', "user")
EDIT_TASK_INSTANCES = _needs('"can edit" on DAGs, DAG Runs and Task Instances', "user")
