.PHONY: demo test lint fixtures bench clean mutation release
demo:  ## run the main job on the embedded default (no Airflow needed)
	scripts/bootstrap.sh "" >/dev/null && .venv/bin/dupguard demo
test:  ## everything CI runs
	scripts/test.sh
mutation:  ## mutation testing of the safety core, score per module (benchmarks/results/mutation.md); not run by CI
	scripts/mutation.sh
release:  ## wheel, sdist, chart and image of a clean tree into dist/ with checksums (docs/release.md)
	scripts/bootstrap.sh test >/dev/null && scripts/release.sh
lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
clean:
	scripts/postgres.sh stop; rm -rf .venv .pg
