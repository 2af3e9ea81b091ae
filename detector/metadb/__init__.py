"""Airflow's metadata database: connections, per-version tables, and every SQL statement dupguard runs."""
