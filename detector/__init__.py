"""dupguard: finds, reports and stops duplicate asset-triggered Airflow DAG runs made by HA schedulers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("airflow-dupguard")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
