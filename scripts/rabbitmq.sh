#!/usr/bin/env bash
# Local RabbitMQ instances for development, tests and CI — no Docker, no systemd.
#
#   scripts/rabbitmq.sh start   [NAME] [PORT]  start (or reuse) an instance, print its AMQP URL
#   scripts/rabbitmq.sh stop    [NAME]         stop it and wait until the process is gone
#   scripts/rabbitmq.sh restart [NAME] [PORT]  stop then start (tests use this for broker restarts)
#   scripts/rabbitmq.sh url     [NAME] [PORT]  print the AMQP URL without starting anything
#   scripts/rabbitmq.sh status                 list the instances under .local/rabbitmq
#   scripts/rabbitmq.sh ctl NAME ARGS...        rabbitmqctl ARGS on instance NAME
#   scripts/rabbitmq.sh cluster start [N] [PORT]  N nodes (default 3) cluster-1..N on PORT,
#                                              PORT+1, ... (default 5700), joined into one
#                                              cluster; prints one AMQP URL per node
#   scripts/rabbitmq.sh cluster stop|urls      stop every node / print their URLs
#   scripts/rabbitmq.sh cluster leader QUEUE   the node leading quorum queue QUEUE
#
# NAME defaults to "carteiro", PORT to 5673 (a system broker usually owns 5672). Each instance
# is a plain process of ours with all state under <repo>/.local/rabbitmq/NAME, so several can
# run side by side. Set CARTEIRO_RABBITMQ_MANAGEMENT=1 to enable the management plugin (HTTP
# on PORT+10000). Set CARTEIRO_RABBITMQ_START_TIMEOUT (seconds, default 90) to bound start-up.
# At start, CARTEIRO_RABBITMQ_CONF_EXTRA (lines) is appended to the instance's rabbitmq.conf
# and CARTEIRO_RABBITMQ_PLUGINS (comma-separated) are enabled too: the TLS tests add a TLS
# listener and rabbitmq_auth_mechanism_ssl this way.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="$REPO/.local/rabbitmq"
# The Debian wrappers in /usr/sbin `su` to the rabbitmq user; we want our own process.
RMQ_BIN=/usr/lib/rabbitmq/bin
START_TIMEOUT="${CARTEIRO_RABBITMQ_START_TIMEOUT:-90}"

die() { echo "rabbitmq.sh: $*" >&2; exit 1; }

ensure_installed() {
    [ -x "$RMQ_BIN/rabbitmq-server" ] && return 0
    echo "rabbitmq.sh: installing Debian's rabbitmq-server" >&2
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
    # noninteractive + </dev/null: CI has no stdin and no one to answer debconf.
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server </dev/null >&2
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server not found after install"
}

# Sets every variable both the server and rabbitmqctl must agree on.
setup_env() {
    NAME="$1"
    DIR="$BASE/$NAME"
    mkdir -p "$DIR/mnesia" "$DIR/log" "$DIR/home"
    if [ -n "${2:-}" ]; then
        PORT="$2"
    elif [ -f "$DIR/port" ]; then
        PORT="$(cat "$DIR/port")"
    else
        PORT=5673
    fi
    case "$PORT" in '' | *[!0-9]*) die "port must be a number, got '$PORT'" ;; esac
    NODE="$NAME@localhost"

    export HOME="$DIR/home" # the Erlang cookie lives here, shared by server and CLI
    export RABBITMQ_NODENAME="$NODE"
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT="$PORT"
    export RABBITMQ_DIST_PORT=$((PORT + 20000)) # distinct per instance, like the default rule
    export RABBITMQ_MNESIA_BASE="$DIR/mnesia"
    export RABBITMQ_LOG_BASE="$DIR/log"
    export RABBITMQ_PID_FILE="$DIR/rabbitmq.pid"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins"
    export RABBITMQ_PLUGINS_EXPAND_DIR="$DIR/plugins-expand"
    # Our own (empty) env and config files so /etc/rabbitmq cannot rename or move the node.
    export RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf"
    export RABBITMQ_CONFIG_FILE="$DIR/rabbitmq.conf"
    export RABBITMQ_ADVANCED_CONFIG_FILE="$DIR/advanced.config"
}

ctl() { "$RMQ_BIN/rabbitmqctl" -n "$NODE" "$@"; }

# No live pid means down; skip the CLI, which takes seconds to give up on a missing node.
is_up() {
    server_pid >/dev/null || return 1
    timeout 15 "$RMQ_BIN/rabbitmqctl" -n "$NODE" ping >/dev/null 2>&1
}

server_pid() {
    local pid
    [ -f "$DIR/rabbitmq.pid" ] || return 1
    pid="$(cat "$DIR/rabbitmq.pid" 2>/dev/null)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

url() { echo "amqp://guest:guest@127.0.0.1:$PORT/%2f"; }

cmd_start() {
    ensure_installed
    setup_env "${1:-carteiro}" "${2:-}"
    if is_up; then
        url
        return 0
    fi
    echo "$PORT" >"$DIR/port"
    if [ ! -s "$HOME/.erlang.cookie" ]; then
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$HOME/.erlang.cookie"
        chmod 400 "$HOME/.erlang.cookie"
    fi
    : >"$RABBITMQ_CONF_ENV_FILE"
    echo "[]." >"$RABBITMQ_ADVANCED_CONFIG_FILE" # an empty file is a parse error
    {
        echo "loopback_users.guest = true"
        if [ "${CARTEIRO_RABBITMQ_MANAGEMENT:-0}" = 1 ]; then
            echo "management.tcp.ip = 127.0.0.1"
            echo "management.tcp.port = $((PORT + 10000))"
        fi
        if [ -n "${CARTEIRO_RABBITMQ_CONF_EXTRA:-}" ]; then
            printf '%s\n' "$CARTEIRO_RABBITMQ_CONF_EXTRA"
        fi
    } >"$RABBITMQ_CONFIG_FILE"
    local plugins="${CARTEIRO_RABBITMQ_PLUGINS:-}"
    if [ "${CARTEIRO_RABBITMQ_MANAGEMENT:-0}" = 1 ]; then
        plugins="rabbitmq_management${plugins:+,$plugins}"
    fi
    echo "[$plugins]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    rm -f "$DIR/rabbitmq.pid"
    # setsid + nohup + </dev/null: detached from our terminal so the caller may exit.
    # Run from DIR so a crash dump (erl_crash.dump) lands there, not in the caller's cwd.
    (cd "$DIR" && exec setsid nohup "$RMQ_BIN/rabbitmq-server" </dev/null >"$DIR/log/stdout.log" 2>&1) &
    local launcher=$!
    local deadline=$((SECONDS + START_TIMEOUT))
    # await_startup fails fast while the node is not yet registered with epmd, so poll.
    until timeout 20 "$RMQ_BIN/rabbitmqctl" -n "$NODE" await_startup --timeout 15 >/dev/null 2>&1; do
        if ! kill -0 "$launcher" 2>/dev/null; then
            tail -n 30 "$DIR/log/stdout.log" >&2 || true
            die "instance $NAME exited during start-up (logs in $DIR/log)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 30 "$DIR/log/stdout.log" >&2 || true
            die "instance $NAME not up after ${START_TIMEOUT}s (logs in $DIR/log)"
        fi
        sleep 1
    done
    url
}

cmd_stop() {
    setup_env "${1:-carteiro}" ""
    local pid
    pid="$(server_pid || true)"
    if is_up; then
        timeout 60 "$RMQ_BIN/rabbitmqctl" -n "$NODE" stop >/dev/null 2>&1 || true
    fi
    [ -n "$pid" ] || pid="$(server_pid || true)"
    if [ -n "$pid" ]; then
        local i
        for i in $(seq 1 600); do
            kill -0 "$pid" 2>/dev/null || break
            # rabbitmqctl stop failed or hung: escalate, we must not return while it lives.
            [ "$i" = 300 ] && kill -TERM "$pid" 2>/dev/null || true
            [ "$i" = 500 ] && kill -KILL "$pid" 2>/dev/null || true
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && die "instance $NAME (pid $pid) is still running"
    fi
    rm -f "$DIR/rabbitmq.pid"
    echo "rabbitmq.sh: $NAME stopped" >&2
}

cmd_status() {
    [ -d "$BASE" ] || { echo "no instances under $BASE"; return 0; }
    local d
    for d in "$BASE"/*/; do
        [ -d "$d" ] || continue
        setup_env "$(basename "$d")" ""
        if is_up; then echo "$NAME up $(url)"; else echo "$NAME down"; fi
    done
}

CLUSTER_PREFIX=cluster

cluster_nodes() {
    local d
    for d in "$BASE/$CLUSTER_PREFIX"-*/; do
        [ -d "$d" ] && basename "$d"
    done | sort -t- -k2 -n
}

cmd_cluster() {
    local sub="${1:-}"
    shift || true
    case "$sub" in
    start)
        local n="${1:-3}" base="${2:-5700}" i first="$CLUSTER_PREFIX-1"
        case "$n" in '' | *[!0-9]*) die "cluster size must be a number, got '$n'" ;; esac
        for i in $(seq 1 "$n"); do
            local name="$CLUSTER_PREFIX-$i"
            if [ "$i" -gt 1 ]; then
                # One Erlang cookie for every node, or they cannot talk.
                mkdir -p "$BASE/$name/home"
                install -m 400 "$BASE/$first/home/.erlang.cookie" "$BASE/$name/home/.erlang.cookie"
            fi
            cmd_start "$name" $((base + i - 1)) >/dev/null
            if [ "$i" -gt 1 ]; then
                setup_env "$name" ""
                if ! ctl cluster_status 2>/dev/null | grep -q "$first@localhost"; then
                    ctl stop_app >/dev/null
                    ctl join_cluster "$first@localhost" >/dev/null
                    ctl start_app >/dev/null
                fi
            fi
        done
        cmd_cluster urls
        ;;
    stop)
        local name
        for name in $(cluster_nodes); do cmd_stop "$name"; done
        ;;
    urls)
        local name
        for name in $(cluster_nodes); do setup_env "$name" ""; url; done
        ;;
    leader)
        [ -n "${1:-}" ] || die "usage: cluster leader QUEUE"
        local name
        for name in $(cluster_nodes); do
            setup_env "$name" ""
            is_up || continue
            ctl list_queues -q --no-table-headers name leader 2>/dev/null |
                awk -v q="$1" '$1 == q { sub(/@.*/, "", $2); print $2; found = 1 } END { exit !found }' && return 0
        done
        die "no running node knows queue $1"
        ;;
    *) die "usage: cluster start [N] [PORT] | stop | urls | leader QUEUE" ;;
    esac
}

case "${1:-}" in
cluster) shift; cmd_cluster "$@" ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
restart) shift; cmd_stop "${1:-carteiro}"; cmd_start "$@" ;;
url) shift; setup_env "${1:-carteiro}" "${2:-}"; url ;;
status) cmd_status ;;
ctl)
    shift
    [ -n "${1:-}" ] || die "usage: ctl NAME ARGS..."
    setup_env "$1" ""
    shift
    ctl "$@"
    ;;
*) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
