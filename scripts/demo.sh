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

# The story's services: their own venv (SQLAlchemy, aio-pika), the enrollment service's own
# database and outbox table, and the aio-pika consumer with its own DLQ.
venv="$repo/.local/demo-venv"
if [[ ! -x "$venv/bin/python" ]] || ! cmp -s examples/matriculas/requirements.txt "$venv/.requirements"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r examples/matriculas/requirements.txt
    cp examples/matriculas/requirements.txt "$venv/.requirements"
fi
service() { "$venv/bin/python" examples/matriculas/service.py "sqlite:///$repo/.local/demo/matriculas.db" "$@"; }
service create
grants="$repo/.local/demo/acessos.txt"
: >"$grants"
consumer=""
start_consumer() {
    "$venv/bin/python" examples/matriculas/consumer.py "$CARTEIRO_AMQP_URL" "$grants" "$@" \
        >>.local/demo/consumer.log 2>&1 &
    consumer=$!
    for _ in $(seq 1 60); do grep -q "consuming" .local/demo/consumer.log && return; sleep 0.5; done
    echo "the story's consumer did not start: .local/demo/consumer.log" >&2
    exit 1
}
: >.local/demo/consumer.log
start_consumer # declares matriculas.dlq, which Carteiro archives

# A local credential for the console's actions (replay, purge, edit), fresh each run.
CARTEIRO_ADMIN_PASSWORD="$(python3 -c 'import secrets; print(secrets.token_urlsafe(12))')"
export CARTEIRO_ADMIN_PASSWORD

"$bin" check -c "$config"
"$bin" run -c "$config" &
gateway=$!
trap 'kill -TERM $gateway $consumer 2>/dev/null; wait $gateway 2>/dev/null || true' EXIT

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
echo "  $good  aluno-1 in rust-101                -> relayed, applied once by route matriculas.carteiro"
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
        echo "  $ev: applied by route matriculas.carteiro (its message id is the route's idempotency key)"
    fi
done
echo
echo "== the story's aio-pika consumer (its own queue and DLQ, archived by Carteiro)"
grep -q "$good" "$grants" && echo "  $good: access granted by the consumer"
echo "  $buggy: nacked by the consumer into matriculas.dlq, archived by Carteiro:"
for _ in $(seq 1 20); do
    "$bin" dlq list -c "$config" --route matriculas.dlq --search "id:$buggy" | grep -q "$buggy" && break
    sleep 0.5
done
"$bin" dlq list -c "$config" --route matriculas.dlq --search "id:$buggy" | sed 's/^/    /'
echo "  deploying the consumer's fix, then replaying its dead letter to its queue only
  (--to-queue: the exchange it came through also feeds Carteiro's route):"
kill -TERM "$consumer"; wait "$consumer" 2>/dev/null || true
start_consumer --fixed
"$bin" dlq replay -c "$config" --route matriculas.dlq --search "id:$buggy" --to-queue matriculas.processar | sed 's/^/    /'
for _ in $(seq 1 20); do grep -q "$buggy" "$grants" && break; sleep 0.5; done
echo "  $buggy: access granted $(grep -c "$buggy" "$grants") time(s) after the replay"

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
echo "console: http://127.0.0.1:9090/ (replay, purge and edit log in as demo / $CARTEIRO_ADMIN_PASSWORD)"
echo "running: the gateway and the story's consumer (both stop with Ctrl-C), and RabbitMQ on"
echo "$CARTEIRO_AMQP_URL (stays up; scripts/rabbitmq.sh stop). The binary is $bin"
echo "(or: cargo install --path host)."
wait $gateway
