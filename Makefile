.PHONY: demo test lint fixtures bench clean mutation
demo:  ## run the main job on the embedded default (no Airflow needed)
	scripts/bootstrap.sh test >/dev/null && .venv/bin/dupguard demo
test:  ## everything CI runs
	scripts/test.sh
mutation:  ## mutation testing of the safety core, score per module (docs/mutation.md); not run by CI
	scripts/mutation.sh
lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
clean:
	scripts/postgres.sh stop; rm -rf .venv .pg
