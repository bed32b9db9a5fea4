#!/usr/bin/env bash
# Builds every handler in plugins/ (examples and test fixtures) as a WebAssembly component
# and copies them to <repo>/target/plugins/:
#   plugins/<name>/              -> target/plugins/<name>.wasm           (enrollment, noop, counter)
#   plugins/fixtures/<name>/     -> target/plugins/fixture-<name>.wasm   (trap, spin, hog, ...)
# The output file is the cargo package name with a .wasm suffix; a member without
# `crate-type = ["cdylib"]` is a shared library, built into them, and not copied. Then the Python and
# JavaScript handlers, through scripts/build-lang-plugins.sh (which installs its own
# toolchains and skips components whose inputs did not change).
#
# Usage: scripts/build-plugins.sh [--rust-only]   (from any directory; CI runs it on a fresh machine)
# Honours CARGO_TARGET_DIR for the cargo build (default <repo>/target); the components are
# always copied to <repo>/target/plugins/.
set -euo pipefail

rust_only=0
[[ "${1:-}" == "--rust-only" ]] && rust_only=1
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
out_dir="$repo/target/plugins"
triple="wasm32-wasip2"

if command -v rustup >/dev/null 2>&1; then
    # Idempotent and quick when the target is already there; needed on a fresh CI machine.
    rustup target add "$triple" >&2
else
    echo "warning: rustup not found; assuming the $triple target is installed" >&2
fi

echo "building plugins for $triple (target dir $target_dir)" >&2
cargo build \
    --manifest-path "$repo/plugins/Cargo.toml" \
    --workspace --release --target "$triple" \
    --target-dir "$target_dir"

mkdir -p "$out_dir"
built="$target_dir/$triple/release"
# Package names from the workspace members' manifests: `name = "..."` in [package].
while IFS= read -r manifest; do
    # A library the handlers share (no cdylib, e.g. enrollment-rules) is no component.
    grep -q '"cdylib"' "$manifest" || continue
    name="$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$manifest" | head -n 1)"
    artifact="$built/${name//-/_}.wasm"
    if [[ ! -f "$artifact" ]]; then
        echo "error: $artifact was not built (package $name, $manifest)" >&2
        exit 1
    fi
    # A component starts with "\0asm" and the component-model layer 0x0d 0x00 0x01 0x00;
    # a core module (0x01 0x00 0x00 0x00) would mean the toolchain did not componentize.
    magic="$(head -c 8 "$artifact" | od -An -tx1 | tr -d ' \n')"
    if [[ "$magic" != "0061736d0d000100" ]]; then
        echo "error: $artifact is not a WebAssembly component (header $magic)" >&2
        exit 1
    fi
    cp "$artifact" "$out_dir/$name.wasm"
    echo "$out_dir/$name.wasm"
done < <(find "$repo/plugins" -name Cargo.toml -not -path "$repo/plugins/Cargo.toml" \
    -not -path "*/target/*" | sort)

if [[ "$rust_only" -eq 0 ]]; then
    "$repo/scripts/build-lang-plugins.sh"
fi
