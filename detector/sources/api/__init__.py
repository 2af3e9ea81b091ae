"""The REST API source: Airflow's public API v2 instead of the metadata database (managed platforms).

- ``reader``: the few read calls dupguard makes and what they answer, as frozen objects;
- ``judge``: a new run's group from the API (siblings, consumed events, task progress, notes),
  judged by the same pure core as the database source;
- ``poll``: the daemon's tail on ``run_after`` (Airflow's clock) and the runs waiting for Airflow;
- ``scan``: the one-shot history audit;
- ``state``: the cursor and alert claims kept in a file, for restarts without a database.

Why this request pattern, and what it cannot see: docs/explanation/api-source.md.
"""
