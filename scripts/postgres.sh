#!/usr/bin/env bash
# Local PostgreSQL 15 for tests and the demo, one data folder per named instance, so a test can
# stop/start its own instance ("database down") while others keep running.
#
#   scripts/postgres.sh start [NAME] [PORT]   init if needed, start (no-op when running), print URL
#   scripts/postgres.sh stop  [NAME]          fast shutdown (no-op when stopped)
#   scripts/postgres.sh url   [NAME] [PORT]   print the URL (port remembered from the last start)
#   scripts/postgres.sh start-tls NAME PORT CERTS
#                                             like start, with ssl = on: CERTS holds server.pem,
#                                             server.key and ca.pem; TCP takes TLS only, and a
#                                             client certificate signed by ca.pem whose CN is the
#                                             user name (pg_hba `hostssl ... cert`)
#
# Every instance runs with wal_level=logical (and room for 32 replication slots and WAL
# senders) so the CDC relay (`[relay] mode = "cdc"`) can read the outbox from a slot; an
# instance started before this setting needs a restart (stop, start) to pick it up.
#
# Data lives in <repo>/.local/postgres/NAME; the server listens on 127.0.0.1:PORT (default
# 55432) with its socket inside the data folder and trust auth: for local tests only.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CMD=${1:-}
NAME=${2:-default}
DATA="$ROOT/.local/postgres/$NAME"
PORT_FILE="$DATA/carteiro.port"

die() { echo "postgres.sh: $*" >&2; exit 1; }

case "$NAME" in
  *[!A-Za-z0-9_-]*|"") die "instance name must be [A-Za-z0-9_-]+, got '$NAME'" ;;
esac

port() {
  if [[ -n "${3:-}" ]]; then echo "$3"
  elif [[ -f "$PORT_FILE" ]]; then cat "$PORT_FILE"
  else echo 55432; fi
}
PORT=$(port "$@")
URL="postgres://postgres@127.0.0.1:$PORT/carteiro"

# Find the server binaries; install them on a fresh machine.
find_bin() {
  if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
    BIN=$(dirname "$(command -v pg_ctl)")
    return 0
  fi
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x "$d/pg_ctl" ]] && { BIN=$d; return 0; }
  done
  return 1
}
if ! find_bin; then
  [[ $(id -u) -eq 0 ]] || die "PostgreSQL is not installed; run: sudo apt-get install -y postgresql"
  echo "postgres.sh: installing postgresql" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  find_bin || die "postgresql installed but pg_ctl not found"
fi
PSQL=$(command -v psql || echo "$BIN/psql")

# postgres refuses to run as root: run the server as an unprivileged user.
RUN=()
if [[ $(id -u) -eq 0 ]]; then
  PGUSER_OS=postgres
  if ! id "$PGUSER_OS" >/dev/null 2>&1; then
    PGUSER_OS=carteiro
    id "$PGUSER_OS" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$PGUSER_OS"
  fi
  RUN=(runuser -u "$PGUSER_OS" --)
fi

# What start() adds for start-tls: server options, and the socket for its own psql (TCP needs
# a client certificate there).
EXTRA_OPTS=""
ADMIN_HOST=127.0.0.1

running() { [[ -f "$DATA/PG_VERSION" ]] && "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

start() {
  init
  if running; then
    # Already up: report the port it really listens on.
    [[ -f "$PORT_FILE" ]] && PORT=$(cat "$PORT_FILE") && URL="postgres://postgres@127.0.0.1:$PORT/carteiro"
  else
    echo "$PORT" >"$PORT_FILE"
    # Settings on the command line so a restart on another port just works.
    "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
      -o "-p $PORT -k '$DATA' -c listen_addresses=127.0.0.1 -c max_connections=300 -c wal_level=logical -c max_replication_slots=32 -c max_wal_senders=32$EXTRA_OPTS" start >/dev/null \
      || { tail -n 20 "$DATA/server.log" >&2; die "could not start PostgreSQL in $DATA on port $PORT"; }
  fi
  local i
  for i in $(seq 1 120); do
    pg_isready -q -h "$ADMIN_HOST" -p "$PORT" && break
    [[ $i -eq 120 ]] && die "PostgreSQL on port $PORT did not accept connections within 60 s"
    sleep 0.5
  done
  if [[ -z $("$PSQL" -h "$ADMIN_HOST" -p "$PORT" -U postgres -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'carteiro'") ]]; then
    "$PSQL" -q -h "$ADMIN_HOST" -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE carteiro" >/dev/null
  fi
  echo "$URL"
}

init() {
  if ! [[ -f "$DATA/PG_VERSION" ]]; then
    mkdir -p "$DATA"
    [[ ${#RUN[@]} -eq 0 ]] || chown "$PGUSER_OS" "$DATA"
    chmod 700 "$DATA"
    "${RUN[@]}" "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-locale >"$DATA.initdb.log" 2>&1 \
      || { cat "$DATA.initdb.log" >&2; die "initdb failed for $DATA"; }
  fi
}

start_tls() {
  local certs=${1:-} f
  [[ -n "$certs" ]] || die "usage: $0 start-tls NAME PORT CERTS"
  for f in server.pem server.key ca.pem; do
    [[ -f "$certs/$f" ]] || die "start-tls: no $certs/$f"
  done
  init
  # The server refuses a key others can read; the files must belong to its user.
  local owner=()
  [[ ${#RUN[@]} -eq 0 ]] || owner=(-o "$PGUSER_OS")
  install -m 600 "${owner[@]}" "$certs/server.pem" "$DATA/server.crt"
  install -m 600 "${owner[@]}" "$certs/server.key" "$DATA/server.key"
  install -m 600 "${owner[@]}" "$certs/ca.pem" "$DATA/root.crt"
  # TCP only over TLS with a client certificate; the socket (this script's psql) trusts.
  cat >"$DATA/pg_hba.conf" <<'HBA'
local   all all                trust
hostssl all all 127.0.0.1/32   cert
hostssl all all ::1/128        cert
HBA
  [[ ${#RUN[@]} -eq 0 ]] || chown "$PGUSER_OS" "$DATA/pg_hba.conf"
  EXTRA_OPTS=" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=root.crt"
  ADMIN_HOST=$DATA
  start
}

stop() {
  if running; then
    # A fast shutdown waits for each logical walsender's client to confirm all it was sent; a
    # CDC relay holding rows it cannot publish yet never does. Past 30 s, stop at once (the
    # next start recovers from WAL, as after a crash).
    "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >/dev/null \
      || "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA" -m immediate -w -t 30 stop >/dev/null
  fi
}

case "$CMD" in
  start) start ;;
  start-tls) start_tls "${4:-}" ;;
  stop) stop ;;
  url) echo "$URL" ;;
  *) die "usage: $0 start|stop|url [NAME] [PORT] | start-tls NAME PORT CERTS" ;;
esac
