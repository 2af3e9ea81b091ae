"""airflow-dupguard-guard: Airflow loads ``dupguard_guard.policy`` through the ``airflow.policy`` entry point."""
