#!/usr/bin/env bash
# The fault campaign: the real gateway under randomized faults, then a lost/duplicate checker.
#
#   scripts/chaos.sh --smoke [--backend sqlite|postgres] [--cluster] [--seed N]   ~2 min (CI)
#   scripts/chaos.sh --full  [--backend sqlite|postgres] [--cluster] [--seed N]   ~30 min
#
# Starts its own RabbitMQ (port 5690, or a 3-node cluster on 5700-5702 with --cluster) and,
# for --backend postgres, its own PostgreSQL (port 55440), so its restarts never touch the
# test suite's services. A failing run prints the --seed that replays its schedule. Full runs
# write bench/results/chaos-<setup>.md. Exit status: 0 passed, 1 the checker found a defect,
# 2 the campaign could not run.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

rustup target add wasm32-wasip2 >/dev/null
# The handlers under test (skipped when up to date), the gateway and the campaign.
[ -f target/plugins/fixture-mixed.wasm ] && [ -f target/plugins/enrollment.wasm ] && [ -f target/plugins/counter.wasm ] \
    && [ -f target/plugins/counter-batch.wasm ] \
    || scripts/build-plugins.sh --rust-only
cargo build -q -p carteiro --bin carteiro
cargo build -q -p carteiro-chaos
# Both scripts install their server on first use.
scripts/postgres.sh url >/dev/null
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
exec env CARTEIRO_BIN="$target_dir/debug/carteiro" "$target_dir/debug/carteiro-chaos" "$@"
