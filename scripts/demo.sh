#!/usr/bin/env bash
# The one command that sets up and runs Carteiro's main job on a fresh machine: a local
# RabbitMQ, SQLite, the example plugins and config/carteiro.toml. The story's enrollment
# service (examples/matriculas, SQLAlchemy) confirms enrollments and writes its own outbox
# rows; Carteiro relays them to a route whose handler applies each event once. It also
# publishes a demo batch (a good enrollment, its duplicate, a malformed one, one whose
# dependency is down), prints what happened to each, and keeps the gateway running until
# Ctrl-C (DEMO_EXIT=1: stop).
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

# The story's service: its own venv (SQLAlchemy), its own database and outbox table.
venv="$repo/.local/demo-venv"
if [[ ! -x "$venv/bin/python" ]] || ! cmp -s examples/matriculas/requirements.txt "$venv/.requirements"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r examples/matriculas/requirements.txt
    cp examples/matriculas/requirements.txt "$venv/.requirements"
fi
service() { "$venv/bin/python" examples/matriculas/service.py "sqlite:///$repo/.local/demo/matriculas.db" "$@"; }
service create

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
echo "  slow-$run_id        content service down         -> 3 attempts (2 retries) with backoff, then DLQ"

echo
echo "== the enrollment service confirms enrollments (one outbox row in each commit)"
good="$(service confirm aluno-1 rust-101)"
echo "  $good  aluno-1 in rust-101                -> relayed, applied once by route matriculas"
buggy="$(service confirm aluno-2 go-201 --sem-curso)"
echo "  $buggy  aluno-2, event without curso_id   -> relayed, dead-lettered by the handler"

sleep 6
echo
echo "== what became of the service's events"
service report "$good" "$buggy"
for ev in "$good" "$buggy"; do
    if "$bin" dlq list -c "$config" --search "id:$ev" | grep -q "$ev"; then
        echo "  $ev: dead-lettered by the route's handler:"
        "$bin" dlq list -c "$config" --search "id:$ev" | sed 's/^/    /'
    else
        echo "  $ev: applied by route matriculas (its message id is the route's idempotency key)"
    fi
done
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
