.PHONY: demo test lint fixtures bench clean
demo:  ## run the main job on the embedded default (no Airflow needed)
	scripts/bootstrap.sh test >/dev/null && .venv/bin/dupguard demo
test:  ## everything CI runs
	scripts/test.sh
lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
clean:
	scripts/postgres.sh stop; rm -rf .venv .pg
