"""Airflow's public REST API v2, shared by the api source and the api remediation backend.

- ``client``: the HTTP client (``apache-airflow-client``'s pool: TLS, CA bundle, no hidden retries)
  and how its answers and failures are turned into safe, one-line messages.
- ``tokens``: the bearer token (static, ``POST /auth/token`` with username/password), cached until
  shortly before its ``exp``.
- ``session``: one authenticated call (timeout, a new token after a 401, 403/404/5xx classified).
"""
