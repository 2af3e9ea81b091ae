"""dupguard's in-scheduler guard: an Airflow cluster policy, in ``policy.py``.

``policy.py`` runs inside Airflow's scheduler, with Airflow's own dependencies (SQLAlchemy 1.4 on
Airflow 3.0/3.1), so it imports nothing but the standard library and Airflow, and nothing in this
package imports it: the daemon never loads it. It ships two ways: as the ``airflow-dupguard-guard``
distribution (deploy/airflow-guard/, an ``airflow.policy`` entry point), and as the text that
``dupguard guard print-local-settings`` prints for ``airflow_local_settings.py``.
"""
