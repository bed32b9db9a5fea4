#!/usr/bin/env bash
# The foreign dead-letter queue tests (tests/foreign_dlq, issue 37): the real `carteiro` binary
# archiving the DLQs of the story's own Python services (an aio-pika consumer, a Celery worker)
# on the RabbitMQ of CARTEIRO_TEST_AMQP_URL (scripts/test.sh sources scripts/services.sh first).
#
# The services live in a venv of their own, <repo>/.local/foreign-dlq-venv, pinned by
# tests/foreign_dlq/requirements.txt and bench/peers/constraints.txt; it is rebuilt only when
# those change, so a run with the venv in place needs no network.
#
# Usage: scripts/test-foreign-dlq.sh [PYTEST ARGS...]     (from any directory)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
suite="$repo/tests/foreign_dlq"
venv="$repo/.local/foreign-dlq-venv"
suite_timeout="${CARTEIRO_FOREIGN_DLQ_TEST_TIMEOUT:-300}"

want="$(cat "$suite/requirements.txt" "$repo/bench/peers/constraints.txt" | sha256sum | cut -c1-16)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]]; then
    python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    echo "== foreign DLQ venv ($venv)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$suite/requirements.txt" \
        -c "$repo/bench/peers/constraints.txt"
    echo "$want" >"$venv/.requirements"
fi

echo "== build (debug carteiro)"
(cd "$repo" && cargo build -q -p carteiro --bin carteiro)
export CARTEIRO_BIN="${CARTEIRO_TARGET_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/carteiro}"

echo "== pytest tests/foreign_dlq"
report="$(mktemp)"
status=0
(cd "$suite" && PATH="$venv/bin:$PATH" timeout "$suite_timeout" "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider --junit-xml="$report" "$@") || status=$?
if [[ $status -eq 5 ]]; then echo "error: tests/foreign_dlq ran no test" >&2; fi
if [[ $status -eq 124 ]]; then echo "error: tests/foreign_dlq timed out after ${suite_timeout}s" >&2; fi
# The counts scripts/test.sh adds up, from pytest's JUnit report (none after a timeout).
"$venv/bin/python" - "$report" <<'PY' || echo "foreign-dlq: 0 passed, 1 failed"
import sys, xml.etree.ElementTree as et
suite = et.parse(sys.argv[1]).getroot().find("testsuite")
failed = int(suite.get("failures")) + int(suite.get("errors"))
passed = int(suite.get("tests")) - failed - int(suite.get("skipped"))
print(f"foreign-dlq: {passed} passed, {failed} failed")
PY
rm -f "$report"
exit "$status"
