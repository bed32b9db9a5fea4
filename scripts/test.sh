#!/usr/bin/env bash
# The one command that sets up and passes every test, on a fresh machine or in CI:
# toolchain target, local RabbitMQ and PostgreSQL, fmt, plugins, clippy, all tests.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# Each stage's wall time, printed at the end: CI's budget is 45 minutes and this shows where
# it goes.
timings=()
stage_name=""
stage_start=$SECONDS
stage() {
  if [[ -n "$stage_name" ]]; then timings+=("$(printf '%5ds  %s' $((SECONDS - stage_start)) "$stage_name")"); fi
  stage_name="$1"
  stage_start=$SECONDS
  if [[ -n "$1" ]]; then echo "== $1"; fi
}
# Runs "$@" for at most $1 seconds: a hung test fails the run with a clear line instead of
# spending all of CI's 90 minutes (libtest names it: "has been running for over 60 seconds").
bounded() {
  local limit="$1"; shift
  local rc=0
  timeout -k 30 "$limit" "$@" || rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "error: '$*' did not finish within ${limit}s; a test hangs (look for 'has been running for over 60 seconds' above)" >&2
  fi
  return "$rc"
}
# A cold CI build gains nothing from incremental compilation and pays for writing its state.
if [[ "${CI:-}" == "true" ]]; then export CARGO_INCREMENTAL=0; fi

stage "toolchain"
rustup target add wasm32-wasip2 >/dev/null
rustup component add rustfmt clippy >/dev/null 2>&1 || true

stage "browser (headless Chromium for the console's browser tests)"
if ! command -v chromedriver >/dev/null || ! command -v chromium >/dev/null; then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver </dev/null >&2
fi

stage "openssl (the TLS tests make their certificates with it)"
if ! command -v openssl >/dev/null; then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl </dev/null >&2
fi

stage "prometheus (promtool and the server for the alert rules' tests)"
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus </dev/null >&2
fi

stage "services"
source scripts/services.sh

stage "fmt"
cargo fmt --all --check
(cd plugins && cargo fmt --all --check)

stage "plugins (wasm32-wasip2 components: Rust, then Python and JavaScript, which are skipped when unchanged)"
scripts/build-plugins.sh

stage "clippy"
cargo clippy --workspace --all-targets -- -D warnings

# The plugins' native tests first, so the run closes on the host's results and a total.
log="$(mktemp)"
stage "tests: plugins (native)"
(cd plugins && cargo test --workspace --target-dir "${CARGO_TARGET_DIR:-$repo/target}") 2>&1 | tee -a "$log"
# The Python and JavaScript SDKs and plugins against their mock hosts (pytest, node --test).
stage "tests: Python and JavaScript SDKs"
scripts/test-lang-sdks.sh 2>&1 | tee -a "$log"
# The Python outbox client (clients/python): its SQLAlchemy models, add_event and the inbox's
# claim, against SQLite and the PostgreSQL started above.
stage "tests: Python outbox client (clients/python)"
scripts/test-python-client.sh 2>&1 | tee -a "$log"
# The dead-letter queues of services Carteiro does not feed (issue 37): the real binary archiving
# the story's aio-pika consumer's and Celery worker's dead letters, replayed back to them.
stage "tests: foreign dead-letter queues (aio-pika, Celery)"
scripts/test-foreign-dlq.sh 2>&1 | tee -a "$log"
stage "tests: workspace (unit, e2e, chaos, SDK)"
bounded "${CARTEIRO_TEST_LIMIT:-2400}" cargo test --workspace 2>&1 | tee -a "$log"
# The operator's stack: promtool on the alert rules, the Debian package of the debug binary
# the tests just built installed with dpkg -i and run, systemd-analyze verify on its units.
stage "tests: operations (rules, package, units)"
scripts/test-ops.sh 2>&1 | tee -a "$log"
# The fault campaign's smoke on both backends, then with CDC relays (a relay SIGKILL and the
# slot holder's SIGSTOP past the takeover always among its faults); each has its own broker
# and PostgreSQL and a random seed: any lost or duplicated effect fails the run and prints the
# seed that replays it.
stage "fault campaign (smoke)"
scripts/chaos.sh --smoke --backend sqlite 2>&1 | tee -a "$log"
scripts/chaos.sh --smoke --backend postgres 2>&1 | tee -a "$log"
scripts/chaos.sh --smoke --backend postgres --cdc 2>&1 | tee -a "$log"
# The peers bench's smoke (Carteiro, the aio-pika pattern, Celery, an ack-only consumer; a
# few hundred messages each): a lost or duplicated effect, a dead letter missing, or a
# system that does not finish fails the run. Figures from it mean nothing; it keeps the
# bench from rotting.
stage "peers bench (smoke)"
bench/run.sh peers --smoke 2>&1 | tee -a "$log"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     /^(lang-sdks|python-client|ops|foreign-dlq): [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
     /^chaos: PASSED/ { p += 1 }
     /^peers: PASSED/ { p += 1 }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
stage ""
echo "== wall time per stage (total ${SECONDS}s)"
printf '%s\n' "${timings[@]}"
