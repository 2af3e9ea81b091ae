"""Where runs come from: each source turns what Airflow recorded into the core's model."""
