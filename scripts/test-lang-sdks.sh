#!/usr/bin/env bash
# Runs the native tests of the Python and JavaScript SDKs and of the Python/JavaScript
# plugins, against their mock hosts (no WebAssembly, no broker):
#   pytest       plugin-sdk/python, then each plugins/**/ with an app.py and a tests/ folder
#   node --test  plugin-sdk/js/test and each plugins/**/ with a package.json and a test/ folder
# Installs the pinned toolchains itself (scripts/lang/toolchain.sh). Exits non-zero if any
# suite fails, times out, or runs no test at all (pytest's exit 5 counts as a failure).
#
# Usage: scripts/test-lang-sdks.sh           (from any directory)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lang/toolchain.sh
source "$repo/scripts/lang/toolchain.sh"

suite_timeout="${CARTEIRO_LANG_TEST_TIMEOUT:-300}"   # seconds per suite
passed=0
failed=0
failures=()

record() { # record NAME PASSED FAILED STATUS
    passed=$((passed + $2))
    failed=$((failed + $3))
    if [[ "$4" != 0 ]]; then failures+=("$1"); fi
}

run_pytest() {
    local dir="$1" name="${1#"$repo"/}" log status=0
    log="$(mktemp)"
    echo "== pytest $name"
    (cd "$dir" && timeout "$suite_timeout" "$py_venv/bin/python" -m pytest -q -p no:cacheprovider) \
        2>&1 | tee "$log" || status=${PIPESTATUS[0]}
    local p f
    p="$(grep -Eo '[0-9]+ passed' "$log" | tail -n 1 | cut -d' ' -f1 || true)"
    f="$({ grep -Eo '[0-9]+ (failed|errors?)' "$log" || true; } | awk '{ n += $1 } END { print n + 0 }')"
    rm -f "$log"
    # 5: no tests collected; 124: timeout. Both are failures.
    if [[ $status -eq 5 ]]; then echo "error: $name ran no test" >&2; fi
    if [[ $status -eq 124 ]]; then echo "error: $name timed out after ${suite_timeout}s" >&2; fi
    record "$name" "${p:-0}" "$f" "$status"
}

run_node() {
    local dir="$1" name="${1#"$repo"/}" log status=0
    log="$(mktemp)"
    echo "== node --test $name"
    (cd "$(dirname "$dir")" && timeout "$suite_timeout" node --test --test-timeout=60000 \
        --test-reporter=spec "$(basename "$dir")/") 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
    local p f
    p="$(sed -n 's/^ℹ pass \([0-9]*\)$/\1/p' "$log" | tail -n 1)"
    f="$(sed -n 's/^ℹ fail \([0-9]*\)$/\1/p' "$log" | tail -n 1)"
    rm -f "$log"
    if [[ "${p:-0}" -eq 0 && "${f:-0}" -eq 0 ]]; then
        echo "error: $name ran no test" >&2
        status=1
    fi
    if [[ $status -eq 124 ]]; then echo "error: $name timed out after ${suite_timeout}s" >&2; fi
    record "$name" "${p:-0}" "${f:-0}" "$status"
}

each_plugin() { # each_plugin FILE FOLDER RUNNER: RUNNER DIR for each plugins/**/ with both
    local dir
    for dir in "$repo"/plugins/*/ "$repo"/plugins/fixtures/*/; do
        dir="${dir%/}"
        if [[ -f "$dir/$1" && -d "$dir/$2" ]]; then "$3" "$dir"; fi
    done
}

run_node_plugin() { run_node "$1/test"; }

ensure_py_toolchain
run_pytest "$repo/plugin-sdk/python"
each_plugin app.py tests run_pytest

ensure_js_toolchain
run_node "$repo/plugin-sdk/js/test"
each_plugin package.json test run_node_plugin

echo "lang-sdks: $passed passed, $failed failed"
if [[ ${#failures[@]} -gt 0 ]]; then
    echo "error: failing suites: ${failures[*]}" >&2
    exit 1
fi
