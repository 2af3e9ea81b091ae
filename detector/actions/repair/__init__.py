"""Repairs of what a periodic check found, written into Airflow's metadata DB (one module per side effect)."""
