#!/usr/bin/env bash
# The one command that sets up and runs Carteiro's main job on a fresh machine: a local
# RabbitMQ, SQLite, the example plugins and config/carteiro.toml. It publishes a demo batch
# (a good enrollment, its duplicate, a malformed one, one whose dependency is down), prints
# what happened to each, and keeps the gateway running until Ctrl-C (DEMO_EXIT=1: stop).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

rustup target add wasm32-wasip2 >/dev/null
CARTEIRO_AMQP_URL="$(scripts/rabbitmq.sh start | tail -n 1)"
export CARTEIRO_AMQP_URL
scripts/build-plugins.sh --rust-only
cargo build -p carteiro
bin="${CARGO_TARGET_DIR:-$repo/target}/debug/carteiro"
config="$repo/config/carteiro.toml"
mkdir -p .local/demo

"$bin" check -c "$config"
"$bin" run -c "$config" &
gateway=$!
trap 'kill -TERM $gateway 2>/dev/null; wait $gateway 2>/dev/null || true' EXIT

ready() { python3 -c 'import urllib.request,sys; urllib.request.urlopen("http://127.0.0.1:9090/readyz", timeout=1)' 2>/dev/null; }
for _ in $(seq 1 120); do ready && break; sleep 0.5; done
ready || { echo "gateway did not become ready" >&2; exit 1; }
sleep 1 # let every route subscribe

run_id="$(date +%s)"
pub() { "$bin" publish -c "$config" --exchange matriculas "$@" >/dev/null; }
echo "== publishing the demo batch (run $run_id)"
pub --routing-key matricula.confirmada --message-id "good-$run_id" \
    --body "{\"matricula_id\":\"M-$run_id\",\"usuario_id\":\"U-1\",\"curso_id\":\"C-42\"}"
echo "  good-$run_id        a valid enrollment           -> ack: kv record + 3 outbox events"
pub --routing-key matricula.confirmada --message-id "good-$run_id" \
    --body "{\"matricula_id\":\"M-$run_id\",\"usuario_id\":\"U-1\",\"curso_id\":\"C-42\"}"
echo "  good-$run_id (again) the same message id      -> acked as a duplicate, no new effects"
pub --routing-key matricula.confirmada --message-id "bad-$run_id" --body '{"matricula_id":"M-x"}'
echo "  bad-$run_id         missing usuario_id/curso_id  -> dead-letter with the field named"
pub --routing-key matricula.degradada --message-id "slow-$run_id" \
    --body "{\"matricula_id\":\"M-s$run_id\",\"usuario_id\":\"U-2\",\"curso_id\":\"C-7\"}"
echo "  slow-$run_id        content service down         -> retry x3 with backoff, then DLQ"

sleep 6
echo
echo "== dead letters"
"$bin" dlq list -c "$config" --since 1m
echo
echo "== outbox"
"$bin" outbox status -c "$config"
echo
echo "== deliveries (from /metrics)"
python3 -c 'import urllib.request; print("\n".join(l for l in urllib.request.urlopen("http://127.0.0.1:9090/metrics").read().decode().splitlines() if l.startswith("carteiro_deliveries_total")))'
echo
if [ "${DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
echo "gateway running (admin on http://127.0.0.1:9090/metrics); Ctrl-C to stop"
wait $gateway
