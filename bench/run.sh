#!/usr/bin/env bash
# One command for every benchmark, on a fresh machine or this one: installs/starts a local
# RabbitMQ and PostgreSQL (scripts/rabbitmq.sh, scripts/postgres.sh), builds the plugins,
# then runs the dispatch, pipeline and relay benchmarks in release (the bench profile) and
# prints their results (also saved under target/bench-results/).
#
#   bench/run.sh                 all three benchmarks
#   bench/run.sh pipeline relay  only those (names of host/benches/*.rs)
#   bench/run.sh search          search at a million archived dead letters, SQLite and
#                                PostgreSQL (host/benches/search.rs; not in the default set:
#                                filling the archives takes several minutes; needs neither the
#                                broker nor the plugins, so only PostgreSQL is started)
#   bench/run.sh outbox          `[[outboxes]]` (poll and cdc) against the story's hand-written
#                                outbox poller on PostgreSQL: drain rate, commit-to-publish,
#                                the database's CPU (bench/outbox/drain.py, results under
#                                bench/results/)
#   bench/run.sh profile         where the gateway's CPU per message goes, by stage, under
#                                `perf record`: the Rust route relay off, relay on claiming
#                                from the table (`immediate = false`) and relay on with
#                                immediate dispatch, SQLite and PostgreSQL
#                                (bench/profile/stages.py, results under bench/results/)
#   bench/run.sh peers           Carteiro's routes against the aio-pika pattern, Celery, an
#                                ack-only consumer and the box's limit (a lapin consumer
#                                publishing the same events; bench/peers/run.py, results under
#                                bench/results/); `peers --smoke`: a few hundred messages,
#                                every system once, fails if any loses or duplicates (CI)
#
# Knobs are environment variables read by the benchmarks (see bench/README.md), e.g.
#   BENCH_MESSAGES=5000 BENCH_ROUNDS=1 bench/run.sh pipeline
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

benches=("$@")
[ ${#benches[@]} -eq 0 ] && benches=(dispatch pipeline relay)
peers=false
outbox=false
if [ "${benches[0]}" = peers ]; then
    peers=true
    peer_args=("${benches[@]:1}")
fi
profile_stages=false
if [ "${benches[0]}" = profile ]; then
    profile_stages=true
    peers=true # the same venv (aio-pika)
    peer_args=()
fi
if [ "${benches[0]}" = outbox ]; then
    outbox=true
    peers=true # the same venv (aio-pika, SQLAlchemy, psycopg2)
    peer_args=("${benches[@]:1}")
fi

echo "== toolchain"
if ! command -v cargo >/dev/null 2>&1; then
    echo "bench/run.sh: cargo not found; install Rust (https://rustup.rs) first" >&2
    exit 1
fi
rustup target add wasm32-wasip2 >/dev/null 2>&1 || true

# `search` reads and writes only the store: no broker, no plugins.
store_only=true
for b in "${benches[@]}"; do [ "$b" = search ] || store_only=false; done

echo "== services"
if $store_only; then
    CARTEIRO_TEST_POSTGRES_URL="$(scripts/postgres.sh start | tail -n 1)"
    export CARTEIRO_TEST_POSTGRES_URL
    echo "postgresql: $CARTEIRO_TEST_POSTGRES_URL"
else
    source scripts/services.sh
fi

if ! $store_only && ! $outbox; then # the outbox bench runs no handler
    echo "== plugins (wasm32-wasip2 components)"
    scripts/build-plugins.sh  # Rust, Python and JavaScript
fi

if $peers; then
    # The peers are Python programs: a venv of their own under .local/, reinstalled only
    # when the pinned requirements change.
    echo "== peers venv (bench/peers/requirements.txt)"
    venv="$repo/.local/peers-venv"
    want="$(cat bench/peers/requirements.txt bench/peers/constraints.txt | sha256sum)"
    if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
        python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check \
            -r bench/peers/requirements.txt -c bench/peers/constraints.txt
        echo "$want" >"$venv/.installed"
    fi
    # The smoke (CI) uses the debug binary scripts/test.sh has built; figures want release.
    # The peers' lapin baseline is built in the same command: one feature set, so it shares
    # every compiled dependency with carteiro and costs one small crate.
    profile=release
    if [[ " ${peer_args[*]} " == *" --smoke "* || "${BENCH_SMOKE:-}" == 1 ]]; then
        profile=debug
    fi
    echo "== build ($profile carteiro, lapin-baseline)"
    cargo build -q $([ $profile = release ] && echo --release) \
        -p carteiro --bin carteiro -p carteiro-bench-lapin --bin lapin-baseline
    bin="${CARGO_TARGET_DIR:-$repo/target}/$profile/carteiro"
    lapin_bin="${CARGO_TARGET_DIR:-$repo/target}/$profile/lapin-baseline"
    if $profile_stages; then
        out="bench/results/profile-$(date -u +%Y-%m-%dT%H%MZ).md"
        n="${BENCH_MESSAGES:-5000}"
        if ! command -v perf >/dev/null 2>&1; then
            echo "== installing perf (Debian's linux-perf)"
            apt-get install -y -q linux-perf >/dev/null || {
                echo "bench/run.sh profile: needs perf (apt-get install linux-perf)" >&2
                exit 1
            }
        fi
        echo "== profile: the gateway's CPU by stage, $n messages per run (results: $out)"
        {
            echo "# Where the gateway's CPU goes, by stage ($(git rev-parse --short HEAD))"
            echo
            echo "\`BENCH_MESSAGES=$n bench/run.sh profile\`; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
            echo
            for store in sqlite postgres; do
                for mode in relay-off table relay-on; do
                    url=sqlite
                    if [ $store = postgres ]; then
                        db="profile_$(date +%s%N)"
                        psql -q "${CARTEIRO_TEST_POSTGRES_URL%/*}/postgres" -c "CREATE DATABASE $db"
                        url="${CARTEIRO_TEST_POSTGRES_URL%/*}/$db"
                    fi
                    "$venv/bin/python" bench/profile/stages.py "$bin" "$repo/target/plugins" \
                        "$CARTEIRO_TEST_AMQP_URL" "$url" $mode "$n" | grep -v '^<!--'
                    [ $store = postgres ] && psql -q "${CARTEIRO_TEST_POSTGRES_URL%/*}/postgres" -c "DROP DATABASE $db"
                done
            done
            echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
        } | tee "$out"
        exit 0
    fi
    if $outbox; then
        db="bench_outbox"
        psql_url="${CARTEIRO_TEST_POSTGRES_URL%/*}/postgres"
        "$venv/bin/python" - "$psql_url" "$db" <<'PY'
import sys
import psycopg2
conn = psycopg2.connect(sys.argv[1]); conn.autocommit = True
cur = conn.cursor()
cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (sys.argv[2],))
if not cur.fetchone():
    cur.execute(f"CREATE DATABASE {sys.argv[2]}")
PY
        out="bench/results/outbox-$(date -u +%Y-%m-%dT%H%MZ).md"
        echo "== run outbox (results: $out)"
        nice -n 10 "$venv/bin/python" bench/outbox/drain.py --amqp "$CARTEIRO_TEST_AMQP_URL" \
            --pg "${CARTEIRO_TEST_POSTGRES_URL%/*}/$db" --carteiro "$bin" "${peer_args[@]}" | tee "$out"
        exit "${PIPESTATUS[0]}"
    fi
    echo "== run peers"
    CARTEIRO_BIN="$bin" CARTEIRO_PLUGINS="$repo/target/plugins" CARTEIRO_LAPIN_BASELINE="$lapin_bin" \
        exec nice -n 10 "$venv/bin/python" bench/peers/run.py "${peer_args[@]}"
fi

args=()
for b in "${benches[@]}"; do args+=(--bench "$b"); done

echo "== build (release; the first build of wasmtime takes several minutes)"
cargo bench -p carteiro "${args[@]}" --no-run

out_dir="${CARGO_TARGET_DIR:-$repo/target}/bench-results"
mkdir -p "$out_dir"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$out_dir/$stamp.txt"
{
    echo "# carteiro benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "# $(nproc) cores, $(uname -sr); rabbitmq and postgresql on this machine"
} >"$out"

echo "== run"
# One benchmark at a time, in the order given: they share the cores with the broker and the
# database, so running them concurrently would measure contention, not the systems.
for b in "${benches[@]}"; do
    echo "--- $b" | tee -a "$out"
    cargo bench -p carteiro --bench "$b" 2>&1 | grep -v -E '^\s*(Compiling|Finished|Running) ' | tee -a "$out"
done
echo "== results saved to $out"
