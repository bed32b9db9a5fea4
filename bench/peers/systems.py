"""The systems the peers bench compares: how to start each one on a run's queue and
database, how to encode a message for it, and how to read its progress and final state
from its own database.

A run is one system on fresh names: queue `peers.<run>`, events exchange
`peers.<run>.events` (bound to a sink queue, so every relayed event is routable), and a
fresh database (an SQLite file in the run folder, or PostgreSQL `CREATE DATABASE <run>`).
"""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import aio_pika
import psycopg2
import psycopg2.errors
from sqlalchemy import create_engine

import business

HERE = Path(__file__).resolve().parent


class NotReady(Exception):
    """The system has not created its tables yet (Carteiro migrates at start-up)."""


class Run:
    def __init__(self, system, run_id, workdir, amqp_url, pg_url, prefetch):
        self.system, self.id, self.dir = system, run_id, workdir
        self.amqp_url, self.pg_url, self.prefetch = amqp_url, pg_url, prefetch
        self.queue = f"peers.{run_id}"
        self.events = f"peers.{run_id}.events"
        self.sink = f"peers.{run_id}.sink"
        self.sqlite_path = workdir / "store.db"
        base = pg_url.rsplit("/", 1)[0]
        self.pg_db_url = f"{base}/{run_id}"

    def query(self, sql):
        """One read on the system's own database, through a connection of its own."""
        if self.system.backend == "sqlite":
            conn = sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30)
        else:
            conn = psycopg2.connect(self.pg_db_url)
        try:
            cur = conn.cursor()
            cur.execute(sql)
            return cur.fetchall()
        except (sqlite3.OperationalError, psycopg2.errors.UndefinedTable) as e:
            if "no such table" in str(e) or isinstance(e, psycopg2.errors.UndefinedTable):
                raise NotReady(str(e)) from e
            raise
        finally:
            conn.close()


def create_database(run):
    if run.system.backend == "sqlite":
        conn = sqlite3.connect(run.sqlite_path)
        conn.execute("PRAGMA journal_mode = WAL")  # what Carteiro sets on its SQLite store
        conn.close()
    else:
        conn = psycopg2.connect(run.pg_url)
        conn.autocommit = True
        conn.cursor().execute(f'CREATE DATABASE "{run.id}"')
        conn.close()


def drop_database(run):
    if run.system.backend == "postgres":
        conn = psycopg2.connect(run.pg_url)
        conn.autocommit = True
        conn.cursor().execute(f'DROP DATABASE IF EXISTS "{run.id}" WITH (FORCE)')
        conn.close()


async def declare_events(channel, run):
    ex = await channel.declare_exchange(run.events, aio_pika.ExchangeType.TOPIC, durable=True)
    sink = await channel.declare_queue(run.sink, durable=True)
    await sink.bind(ex, "#")


async def declare_route(channel, run):
    """Carteiro's route topology (host/src/topology/declare.rs, classic queue), which the
    aio-pika pattern declares too; declared before publishing the backlog. A difference
    would stop the system at start-up with a PRECONDITION_FAILED, never pass silently."""
    dlx = await channel.declare_exchange(f"{run.queue}.dlx", aio_pika.ExchangeType.FANOUT,
                                         durable=True)
    dlq = await channel.declare_queue(f"{run.queue}.dlq", durable=True)
    await dlq.bind(dlx, "")
    await channel.declare_queue(run.queue, durable=True,
                                arguments={"x-dead-letter-exchange": f"{run.queue}.dlx"})


async def clean_broker(connection, run):
    """Deletes the run's queues and exchanges: the broker is shared, leave nothing behind."""
    retry_tier = f"{run.queue}.retry.{int(business.RETRY_DELAY_S * 1000)}ms"  # Carteiro's
    for name in (run.queue, f"{run.queue}.dlq", f"{run.queue}.retry", retry_tier, run.sink):
        # A channel per delete: deleting a queue that is not there closes the channel.
        async with connection.channel() as channel:
            await channel.queue_delete(name)
    for name in (f"{run.queue}.dlx", run.events):
        async with connection.channel() as channel:
            await channel.exchange_delete(name)


def enrollment(mid, kind):
    """The body of message `mid` for the peers (and Carteiro's enrollment plugin)."""
    if kind == "poison":
        return b"{oops"  # not JSON: the enrollment handler dead-letters it
    doc = {"matricula_id": mid, "usuario_id": f"U{mid}", "curso_id": "C1"}
    if kind == "transient":
        doc["fail_until_attempt"] = 2  # fails once, succeeds on its retry
    return json.dumps(doc).encode()


class Carteiro:
    """The real `carteiro run`, with the enrollment plugin (throughput, latency) or, for the
    failure mix, plugins/fixtures/mixed: `retry-until-2` retries once then acks, `trap` traps
    (dead-lettered at once: on_plugin_failure = "dead-letter", as the peers treat poison).
    The enrollment plugin has no per-message transient failure, hence the fixture; its ack
    writes one kv row `done/<message id>` (version 1 if written once) and no events."""

    kind = "carteiro"

    def __init__(self, backend, binary, plugins, lang="rust", batch=False, relay=True):
        """`lang` "py" or "js": the reference Python or JavaScript enrollment handler
        (plugins/enrollment-py, -js; the same effects). Its `[plugins.NAME]` entry gives only
        `path` and `memory` (the config's defaults, whatever they are), or with `batch`
        `isolation = "per-batch"`, `reuse = BENCH_REUSE` (64) too. `relay` False:
        `[relay] enabled = false`, the consumer side alone (the outbox rows stay pending)."""
        self.backend, self.binary, self.plugins = backend, binary, plugins
        self.lang, self.batch, self.relay = lang, batch, relay
        parts = ["carteiro"] + ([] if lang == "rust" else [lang]) + (["batch"] if batch else [])
        parts += ([] if relay else ["relay-off"]) + [backend]
        self.name = "-".join(parts)

    async def declare(self, channel, run):
        await declare_route(channel, run)

    def message(self, mid, kind, mix):
        if mix and kind != "ok":
            body = b"retry-until-2" if kind == "transient" else b"trap"
        else:
            body = enrollment(mid, kind)
        return aio_pika.Message(body, message_id=mid, content_type="application/json",
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    def write_config(self, run, mix):
        store = (f"sqlite://{run.sqlite_path}" if self.backend == "sqlite" else run.pg_db_url)
        plugin = "fixture-mixed" if mix else "enrollment"
        isolation = ""
        if self.lang != "rust" and not mix:
            plugin = f"enrollment-{self.lang}"
            isolation = 'memory = "64MiB"'  # what the scaffold's README writes
            if self.batch:
                isolation += ('\nisolation = "per-batch"\n'
                              f'reuse = {os.environ.get("BENCH_REUSE", "64")}')
        relay = "" if self.relay else "[relay]\nenabled = false"
        config = f"""
version = 1
[broker]
url = "{run.amqp_url}"
[store]
url = "{store}"
[admin]
listen = ""
{relay}
[plugins.p]
path = "{self.plugins}/{plugin}.wasm"
{isolation}
[plugins.p.variables]
events_exchange = "{run.events}"
[[routes]]
queue = "{run.queue}"
plugin = "p"
prefetch = {run.prefetch}
idempotency_key = "message_id"
on_plugin_failure = "dead-letter"
[routes.retry]
max_attempts = {business.MAX_ATTEMPTS}
backoff = ["{int(business.RETRY_DELAY_S * 1000)}ms"]
"""
        path = run.dir / f"carteiro-{'mix' if mix else 'enrollment'}.toml"
        path.write_text(config)
        return path

    def warm(self, run):
        """Compiles the route's plugin into Carteiro's compile cache (`carteiro check`), so
        that no measured start-up includes a first compile."""
        path = self.write_config(run, mix=False)
        subprocess.run([str(self.binary), "check", "--no-environment", "--config", str(path)],
                       check=True, capture_output=True, timeout=600)

    def start(self, run, mix):
        path = self.write_config(run, mix)
        log = open(run.dir / "carteiro.log", "ab")
        return [subprocess.Popen([str(self.binary), "run", "--config", str(path)],
                                 stdout=log, stderr=log, start_new_session=True)]

    def done(self, run, prefix):
        return run.query(f"SELECT count(*) FROM kv WHERE key LIKE 'matricula/{prefix}%'")[0][0]

    def commit_times(self, run, prefix):
        rows = run.query(f"SELECT key, updated_at FROM kv WHERE key LIKE 'matricula/{prefix}%'")
        return {k[len("matricula/"):]: t for k, t in rows}

    def outbox(self, run):
        """(rows, pending rows, last publish time in ms)."""
        return run.query("SELECT count(*), count(*) - count(published_at), max(published_at) "
                         "FROM outbox")[0]

    async def final_state(self, run, channel, prefix):
        effects, max_version = run.query(
            f"SELECT count(*), max(version) FROM kv WHERE key LIKE 'done/{prefix}%'")[0]
        dead = run.query("SELECT count(*) FROM dead_letters")[0][0]
        return {"effects": effects, "rewrites": max(0, (max_version or 1) - 1),
                "events": None, "dead": dead}


class Pattern:
    """Peer (a): pattern.py, on SQLite (aiosqlite) or PostgreSQL (asyncpg)."""

    kind = "pattern"

    def __init__(self, backend, python):
        self.backend, self.python = backend, python
        self.name = f"pattern-{backend}"

    def db_url(self, run, driver):
        if self.backend == "sqlite":
            return f"sqlite+{driver['sqlite']}:///{run.sqlite_path}"
        return run.pg_db_url.replace("postgres://", f"postgresql+{driver['postgres']}://", 1)

    def create_schema(self, run):
        engine = create_engine(self.db_url(run, {"sqlite": "pysqlite", "postgres": "psycopg2"}))
        business.metadata.create_all(engine)
        engine.dispose()

    async def declare(self, channel, run):
        self.create_schema(run)
        await declare_route(channel, run)

    def message(self, mid, kind, mix):
        return aio_pika.Message(enrollment(mid, kind), message_id=mid,
                                content_type="application/json",
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    def start(self, run, mix):
        url = self.db_url(run, {"sqlite": "aiosqlite", "postgres": "asyncpg"})
        log = open(run.dir / "pattern.log", "ab")
        return [subprocess.Popen(
            [self.python, str(HERE / "pattern.py"), run.amqp_url, url, run.queue, run.events,
             str(run.prefetch)], cwd=HERE, stdout=log, stderr=log, start_new_session=True)]

    def done(self, run, prefix):
        return run.query(
            f"SELECT count(*) FROM enrollments WHERE message_id LIKE '{prefix}%'")[0][0]

    def commit_times(self, run, prefix):
        return dict(run.query("SELECT message_id, committed_at_ms FROM enrollments "
                              f"WHERE message_id LIKE '{prefix}%'"))

    def outbox(self, run):
        return run.query("SELECT count(*), count(*) - count(published_at_ms), "
                         "max(published_at_ms) FROM outbox")[0]

    async def dead(self, run, channel):
        dlq = await channel.declare_queue(f"{run.queue}.dlq", passive=True)
        return dlq.declaration_result.message_count

    async def final_state(self, run, channel, prefix):
        effects = self.done(run, prefix)
        events = run.query(
            f"SELECT count(*) FROM outbox WHERE causation_id LIKE '{prefix}%'")[0][0]
        return {"effects": effects, "rewrites": 0, "events": events,
                "dead": await self.dead(run, channel)}


class CeleryPeer(Pattern):
    """Peer (b): a Celery worker (prefork, one process per core) plus relay.py."""

    kind = "celery"

    def __init__(self, backend, python):
        super().__init__(backend, python)
        self.name = f"celery-{backend}"

    async def declare(self, channel, run):
        self.create_schema(run)
        # What Celery declares for its default queue: a durable queue, no arguments.
        await channel.declare_queue(run.queue, durable=True)

    def message(self, mid, kind, mix):
        """A Celery protocol-2 task message, as `enroll.apply_async(args=[body], task_id=mid)`
        would publish it (built here so that every system gets its backlog the same way)."""
        body = json.dumps([[enrollment(mid, kind).decode()], {},
                           {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
        headers = {"lang": "py", "task": "peers.enroll", "id": mid, "shadow": None, "eta": None,
                   "expires": None, "group": None, "group_index": None, "retries": 0,
                   "timelimit": [None, None], "root_id": mid, "parent_id": None,
                   "argsrepr": "", "kwargsrepr": "", "origin": "peers-bench",
                   "ignore_result": True}
        return aio_pika.Message(body.encode(), message_id=mid, correlation_id=mid,
                                headers=headers, content_type="application/json",
                                content_encoding="utf-8",
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    def start(self, run, mix):
        env = dict(os.environ, PEERS_AMQP_URL=run.amqp_url, PEERS_QUEUE=run.queue,
                   PEERS_EVENTS_EXCHANGE=run.events,
                   PEERS_DB_URL=self.db_url(run, {"sqlite": "pysqlite", "postgres": "psycopg2"}))
        log = open(run.dir / "celery.log", "ab")
        cores = os.cpu_count() or 1
        worker = subprocess.Popen(
            [self.python, "-m", "celery", "-A", "celery_app", "worker", "-Q", run.queue,
             "--pool=prefork", f"--concurrency={cores}",
             # Celery's prefetch is per process: the same total prefetch as the others.
             f"--prefetch-multiplier={max(1, run.prefetch // cores)}",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel=WARNING"], cwd=HERE, env=env, stdout=log, stderr=log,
            start_new_session=True)
        relay = subprocess.Popen(
            [self.python, str(HERE / "relay.py"), run.amqp_url,
             self.db_url(run, {"sqlite": "aiosqlite", "postgres": "asyncpg"})],
            cwd=HERE, stdout=log, stderr=log, start_new_session=True)
        return [worker, relay]

    async def dead(self, run, channel):
        return run.query("SELECT count(*) FROM failed_messages")[0][0]


class Baseline:
    """Peer (d): baseline.py, ack-only; no database, no effects, no failure mix."""

    kind = "baseline"
    backend = "none"
    name = "baseline-ack"

    def __init__(self, python):
        self.python = python

    async def declare(self, channel, run):
        await declare_route(channel, run)

    def message(self, mid, kind, mix):
        return aio_pika.Message(enrollment(mid, kind), message_id=mid,
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    def start(self, run, mix, expect=0):
        log = open(run.dir / "baseline.log", "ab")
        return [subprocess.Popen(
            [self.python, str(HERE / "baseline.py"), run.amqp_url, run.queue,
             str(run.prefetch), str(expect), str(run.dir / "done")],
            cwd=HERE, stdout=log, stderr=log, start_new_session=True)]

    async def check(self, run, channel, n):
        """A difference in what the run left on the broker, or None."""
        return None


class LapinBaseline(Baseline):
    """The box's limit: lapin-baseline (bench/peers/lapin-baseline), a Rust lapin consumer
    that publishes the enrollment handler's 3 events with confirms and acks, writing
    nothing. Its run must leave exactly 3 events per message on the sink queue."""

    name = "lapin-baseline"

    def __init__(self, binary):
        self.binary = binary

    def start(self, run, mix, expect=0):
        log = open(run.dir / "lapin-baseline.log", "ab")
        return [subprocess.Popen(
            [str(self.binary), run.amqp_url, run.queue, str(run.prefetch), str(expect),
             str(run.dir / "done"), run.events],
            stdout=log, stderr=log, start_new_session=True)]

    async def check(self, run, channel, n):
        sink = await channel.declare_queue(run.sink, passive=True)
        events = sink.declaration_result.message_count
        left = (await channel.declare_queue(run.queue, passive=True)).declaration_result
        if events != 3 * n or left.message_count != 0:
            return (f"{events} events on the sink for {n} messages (want {3 * n}), "
                    f"{left.message_count} left on the queue")
        return None


def systems(names, binary, plugins, lapin):
    python = sys.executable
    known = {"lapin-baseline": lambda: LapinBaseline(lapin),
             "baseline": lambda: Baseline(python)}
    for backend in ("sqlite", "postgres"):
        for c in (Carteiro(backend, binary, plugins),
                  Carteiro(backend, binary, plugins, relay=False),
                  *(Carteiro(backend, binary, plugins, lang, batch)
                    for lang in ("py", "js") for batch in (False, True))):
            known[c.name] = lambda c=c: c
        known[f"pattern-{backend}"] = lambda b=backend: Pattern(b, python)
        known[f"celery-{backend}"] = lambda b=backend: CeleryPeer(b, python)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; known: {', '.join(known)}")
    return [known[n]() for n in names]
