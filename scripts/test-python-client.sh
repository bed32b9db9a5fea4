#!/usr/bin/env bash
# Runs the pytest suite of the Python outbox client (clients/python, `carteiro-outbox`) against
# SQLite and, when CARTEIRO_TEST_POSTGRES_URL is set (scripts/test.sh sources
# scripts/services.sh first), PostgreSQL.
#
# The client lives in a venv of its own, <repo>/.local/outbox-venv, with the pinned
# clients/python/requirements-test.txt; it is rebuilt only when that file changes, so a run
# with the venv in place needs no network. The package is reinstalled (not editable, as a
# user's `pip install ./clients/python` would) when its sources change.
#
# Usage: scripts/test-python-client.sh [PYTEST ARGS...]     (from any directory)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
client="$repo/clients/python"
venv="$repo/.local/outbox-venv"
suite_timeout="${CARTEIRO_PY_CLIENT_TEST_TIMEOUT:-300}"

want="$(sha256sum <"$client/requirements-test.txt" | cut -c1-16)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]]; then
    python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "error: $python (Python >= 3.11: the tests read TOML with tomllib) is needed" >&2
        exit 1
    fi
    echo "== python client venv ($venv)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$client/requirements-test.txt"
    echo "$want" >"$venv/.requirements"
fi

# The package itself: offline (--no-index, --no-build-isolation: setuptools is pinned in the
# venv), only when pyproject.toml or a source file changed.
sources="$( (cd "$client" && find pyproject.toml README.md src -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 \
    | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)"
if [[ "$(cat "$venv/.package" 2>/dev/null)" != "$sources" ]]; then
    rm -rf "$client/build"  # setuptools builds in the tree: no stale module from a last build
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps \
        --no-build-isolation --force-reinstall "$client"
    echo "$sources" >"$venv/.package"
fi

echo "== pytest clients/python (postgresql: ${CARTEIRO_TEST_POSTGRES_URL:-not set, skipped})"
log="$(mktemp)"
status=0
# The src/ layout keeps the checkout off sys.path: the tests import the installed package.
(cd "$client" && timeout "$suite_timeout" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@") \
    2>&1 | tee "$log" || status=${PIPESTATUS[0]}
# pytest's closing line, e.g. "38 passed, 3 skipped, 2 errors in 9.21s".
summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped)' "$log" | tail -n 1 || true)"
passed="$(grep -Eo '[0-9]+ passed' <<<"$summary" | cut -d' ' -f1 || true)"
failed="$({ grep -Eo '[0-9]+ (failed|errors?)' <<<"$summary" || true; } | awk '{ n += $1 } END { print n + 0 }')"
rm -f "$log"
if [[ $status -eq 5 ]]; then echo "error: clients/python ran no test" >&2; fi
if [[ $status -eq 124 ]]; then echo "error: clients/python timed out after ${suite_timeout}s" >&2; fi
echo "python-client: ${passed:-0} passed, $failed failed"
exit "$status"
