# Sourced by scripts/build-lang-plugins.sh and scripts/test-lang-sdks.sh: installs the
# pinned Python and JavaScript toolchains on a fresh machine, and is quick when they are
# already there. Expects $repo.
#   Python: a venv in <repo>/.local/py with scripts/lang/requirements.txt and the SDK
#           (editable, so its tests and the plugins' tests import the working copy).
#   JS:     `npm ci` of the root workspace (package-lock.json): ComponentizeJS, rolldown,
#           and carteiro-sdk linked into node_modules for the plugins.

py_venv="$repo/.local/py"

ensure_py_toolchain() {
    local stamp="$py_venv/.carteiro-toolchain"
    local want
    want="$(cat "$repo/scripts/lang/requirements.txt" "$repo/plugin-sdk/python/pyproject.toml" | sha256sum | cut -c1-16)"
    if [[ -x "$py_venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return 0
    fi
    local python="${PYTHON:-python3}"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        echo "error: $python (Python >= 3.10) is needed for the Python SDK and componentize-py" >&2
        return 1
    fi
    echo "installing the Python toolchain into $py_venv" >&2
    "$python" -m venv "$py_venv"
    "$py_venv/bin/pip" install --quiet --disable-pip-version-check \
        -r "$repo/scripts/lang/requirements.txt" >&2
    "$py_venv/bin/pip" install --quiet --disable-pip-version-check \
        -e "$repo/plugin-sdk/python" >&2
    echo "$want" > "$stamp"
}

ensure_js_toolchain() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "error: node and npm (Node >= 20) are needed for the JavaScript SDK and ComponentizeJS" >&2
        return 1
    fi
    local lock="$repo/package-lock.json" installed="$repo/node_modules/.package-lock.json"
    # npm writes node_modules/.package-lock.json on install; a newer lockfile means reinstall.
    if [[ -f "$installed" && ! "$lock" -nt "$installed" && -e "$repo/node_modules/carteiro-sdk" ]]; then
        return 0
    fi
    echo "installing the JavaScript toolchain (npm ci)" >&2
    (cd "$repo" && npm ci --no-audit --no-fund --loglevel=error >&2)
}
