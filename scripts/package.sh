#!/usr/bin/env bash
# Builds the Debian package with cargo-deb: the binary, the systemd units, the example config
# and handler, the docs, shell completions and man pages (generated from the binary itself).
#
#   scripts/package.sh                   release build, then target/debian/carteiro_*.deb
#   scripts/package.sh --profile dev     package the debug binary `cargo build` (or the
#                                        test suite) already made: no release build (tests)
#
# Prints the .deb's path last. Installs cargo-deb (cargo install) when it is missing.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
target="${CARGO_TARGET_DIR:-$repo/target}"
profile="release"
if [[ "${1:-}" == "--profile" ]]; then profile="$2"; fi
profile_dir="$profile"
[[ "$profile" == "dev" ]] && profile_dir="debug"

if ! cargo deb --version >/dev/null 2>&1; then
  echo "package.sh: installing cargo-deb" >&2
  cargo install cargo-deb --locked --version 3.8.0 >&2
fi

# The debug binary is the one the tests already built; a release build costs minutes.
cargo build -p carteiro --bin carteiro --profile "$profile" >&2
if [[ ! -f target/plugins/enrollment.wasm ]]; then scripts/build-plugins.sh >&2; fi

# What the package carries that the binary makes.
bin="$target/$profile_dir/carteiro"
assets="$repo/.local/deb"
rm -rf "$assets" && mkdir -p "$assets/man"
"$bin" completions bash >"$assets/carteiro.bash"
"$bin" completions zsh >"$assets/_carteiro"
"$bin" completions fish >"$assets/carteiro.fish"
"$bin" man "$assets/man"
cp target/plugins/enrollment.wasm "$assets/"

mkdir -p "$target/debian"
cargo deb -p carteiro --no-build --profile "$profile" --strip --no-dbgsym -o "$target/debian" >&2
ls -t "$target"/debian/carteiro_*.deb | head -n 1
