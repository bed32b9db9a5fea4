#!/usr/bin/env bash
# Builds the Python and JavaScript handlers in plugins/ as WebAssembly components and puts
# them beside the Rust ones in <repo>/target/plugins/:
#   plugins/<name>/app.py                   -> target/plugins/<name>.wasm          (componentize-py;
#                                              world batch-handler if it uses @carteiro.batch_handler)
#   plugins/fixtures/<name>/app.py          -> target/plugins/fixture-<name>.wasm
#     (a fixture named standard-* is built against the vendored wasi:messaging@0.2.0-draft
#     WIT, world messaging-core, without the carteiro SDK)
#   plugins/<name>/package.json ("main")    -> target/plugins/<name>.wasm          (ComponentizeJS)
#   plugins/fixtures/<name>/package.json    -> target/plugins/fixture-<name>.wasm
# Installs its pinned toolchains itself (scripts/lang/toolchain.sh). A component whose
# inputs (plugin sources, SDK, WIT, build scripts, toolchain versions) are unchanged since
# its last build is skipped: the inputs' hash is kept beside it in <name>.wasm.inputs.
# Python and JavaScript components build in two parallel lanes (one per core).
#
# Usage: scripts/build-lang-plugins.sh [--force]        (from any directory)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="$repo/target/plugins"
wit="$repo/plugin-sdk/wit"
standard_wit="$wit/wasi-messaging-0.2.0-draft"
force=0
[[ "${1:-}" == "--force" ]] && force=1

# shellcheck source=lang/toolchain.sh
source "$repo/scripts/lang/toolchain.sh"

# Hash of every file under the given paths (tests and installed dependencies excluded).
hash_inputs() {
    # -L: a plugin may link a sibling's module (enrollment-py-batch links enrollment-py's).
    find -L "$@" -type f -not -path '*/node_modules/*' -not -path '*/__pycache__/*' \
        -not -path '*/tests/*' -not -path '*/test/*' -not -name '*.pyc' -print0 \
        | LC_ALL=C sort -z | xargs -0 sha256sum | sed "s|$repo/||" | sha256sum | cut -d' ' -f1
}

check_component() {
    local file="$1" magic
    # "\0asm" + component-model layer 0x0d 0x00 0x01 0x00 (a core module would be 01 00 00 00).
    magic="$(head -c 8 "$file" | od -An -tx1 | tr -d ' \n')"
    if [[ "$magic" != "0061736d0d000100" ]]; then
        echo "error: $file is not a WebAssembly component (header $magic)" >&2
        return 1
    fi
}

# build_one NAME HASH COMMAND...: runs COMMAND (which writes $tmp) unless NAME is up to date.
build_one() {
    local name="$1" hash="$2"
    shift 2
    local out="$out_dir/$name.wasm" stamp="$out_dir/$name.wasm.inputs"
    if [[ $force -eq 0 && -f "$out" && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] \
        && check_component "$out" 2>/dev/null; then
        echo "$out (up to date)"
        return 0
    fi
    tmp="$out.tmp"
    local start=$SECONDS
    rm -f "$tmp" "$stamp"
    if ! "$@" >"$out_dir/$name.log" 2>&1; then
        cat "$out_dir/$name.log" >&2
        echo "error: building $name failed (log: $out_dir/$name.log)" >&2
        return 1
    fi
    check_component "$tmp"
    mv "$tmp" "$out"
    echo "$hash" > "$stamp"
    echo "$out ($(( $(stat -c %s "$out") / 1024 )) KiB, built in $((SECONDS - start)) s)"
}

plugin_name() {
    local dir="$1"
    case "$dir" in
        "$repo/plugins/fixtures/"*) echo "fixture-$(basename "$dir")" ;;
        *) basename "$dir" ;;
    esac
}

build_python() {
    ensure_py_toolchain
    local version common
    version="$("$py_venv/bin/componentize-py" --version)"
    common="$(hash_inputs "$repo/plugin-sdk/python/src" "$wit" "$repo/scripts/build-lang-plugins.sh")"
    local dir
    for dir in "$repo"/plugins/*/ "$repo"/plugins/fixtures/*/; do
        dir="${dir%/}"
        [[ -f "$dir/app.py" ]] || continue
        local name hash
        name="$(plugin_name "$dir")"
        hash="$(printf '%s\n' "$version" "$common" "$(hash_inputs "$dir")" | sha256sum | cut -d' ' -f1)"
        if [[ "$(basename "$dir")" == standard-* ]]; then
            # A portable wasi:messaging component: the standard WIT, its default world module.
            build_one "$name" "$hash" env -u VIRTUAL_ENV "$py_venv/bin/componentize-py" \
                -d "$standard_wit" -w messaging-core \
                componentize app -p "$dir" -o "$out_dir/$name.wasm.tmp"
            continue
        fi
        # A batch handler (`@carteiro.batch_handler`) is a component of world batch-handler.
        local world=handler
        grep -q '@carteiro.batch_handler' "$dir/app.py" && world=batch-handler
        # componentize-py sees the handler's folder only, so a module linked in from another
        # handler (enrollment-py-batch's enrollment.py) is copied into a staging folder.
        local src="$dir" stage=""
        if [[ -n "$(find "$dir" -maxdepth 1 -type l)" ]]; then
            stage="$(mktemp -d)"
            cp -rL "$dir/." "$stage/"
            src="$stage"
        fi
        # VIRTUAL_ENV unset: componentize-py would add the toolchain venv's site-packages.
        build_one "$name" "$hash" env -u VIRTUAL_ENV "$py_venv/bin/componentize-py" \
            -d "$wit" -w "$world" --world-module _carteiro_wit \
            componentize app -p "$src" -p "$repo/plugin-sdk/python/src" -o "$out_dir/$name.wasm.tmp"
        [[ -z "$stage" ]] || rm -rf "$stage"
    done
}

build_js() {
    ensure_js_toolchain
    local version common
    version="$(cd "$repo" && node -p "['@bytecodealliance/componentize-js', 'rolldown'].map((p) => p + '@' + require('./node_modules/' + p + '/package.json').version).join(' ')")"
    common="$(hash_inputs "$repo/plugin-sdk/js/src" "$repo/plugin-sdk/js/package.json" "$wit" \
        "$repo/scripts/lang/componentize-js.mjs" "$repo/scripts/build-lang-plugins.sh" "$repo/package-lock.json")"
    local dir
    for dir in "$repo"/plugins/*/ "$repo"/plugins/fixtures/*/; do
        dir="${dir%/}"
        [[ -f "$dir/package.json" ]] || continue
        local name hash main
        name="$(plugin_name "$dir")"
        main="$(cd "$dir" && node -p "require('./package.json').main || 'src/handler.js'")"
        hash="$(printf '%s\n' "$version" "$common" "$(hash_inputs "$dir")" | sha256sum | cut -d' ' -f1)"
        build_one "$name" "$hash" node "$repo/scripts/lang/componentize-js.mjs" \
            "$dir/$main" "$out_dir/$name.wasm.tmp" "$wit"
    done
}

mkdir -p "$out_dir"
start=$SECONDS
build_python > "$out_dir/.lang-python.out" 2>&1 &
py_pid=$!
build_js > "$out_dir/.lang-js.out" 2>&1 &
js_pid=$!
status=0
wait "$py_pid" || status=1
wait "$js_pid" || status=1
cat "$out_dir/.lang-python.out" "$out_dir/.lang-js.out"
rm -f "$out_dir/.lang-python.out" "$out_dir/.lang-js.out"
if [[ $status -ne 0 ]]; then
    echo "error: building the Python/JavaScript plugins failed" >&2
    exit 1
fi
echo "Python and JavaScript plugins ready in $((SECONDS - start)) s" >&2
