"""Carteiro's `[[outboxes]]` relay against the story's hand-written poller, side by side on
the story's `outbox_events` table in PostgreSQL (bench/run.sh outbox).

- drain: ROWS pending rows; each side timed from its start to the last row marked, rounds
  alternating (poller, carteiro poll, carteiro cdc, ...). The poller is the story's code: 100
  rows a query ordered by criado_em, each published with a confirm over one long-lived
  aio-pika connection and marked in a commit of its own; it runs back to back (the story's
  Celery Beat schedule waits 2 s between runs, which would only slow it).
- latency: with each side running, a writer commits RATE rows a second for LATENCY_S
  seconds; commit-to-publish is the time from the writer's commit to the consumer's receipt.
- idle: each side running on an empty table for IDLE_S seconds: the database's CPU.

CPU is read from /proc: the PostgreSQL server's processes, and the relay's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime

import aio_pika
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peers"))
from procfs import cpu_seconds, postgres_pids, tree  # noqa: E402


# The story's table, exactly as the story declares it: the demo's enrollment service's model.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "matriculas"))
from service import Base, OutboxEvent  # noqa: E402


EXCHANGE = "bench.matriculas"
QUEUE = "bench.matriculas.sink"


def payload(i: int) -> str:
    return json.dumps({"matricula_id": i, "usuario_id": i % 977, "curso_id": f"C-{i % 31}"})


def reset(engine, rows: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE outbox_events RESTART IDENTITY"))
    batch = 5000
    with Session(engine) as s:
        for start in range(0, rows, batch):
            s.add_all(
                OutboxEvent(evento_id=str(uuid.uuid4()), tipo="matricula.confirmada",
                            routing_key="matricula.confirmada", payload=payload(i))
                for i in range(start, min(rows, start + batch)))
            s.commit()
    with engine.begin() as conn:
        conn.execute(text("ANALYZE outbox_events"))


def unpublished(engine) -> int:
    with Session(engine) as s:
        return s.scalar(select(func.count()).select_from(OutboxEvent).where(OutboxEvent.publicado.is_(False)))


# --- the story's poller ------------------------------------------------------------------

async def story_poller(engine, amqp_url: str, stop: threading.Event) -> None:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE)
        while not stop.is_set():
            session = Session(engine)
            try:
                pendentes = (
                    session.query(OutboxEvent)
                    .filter(OutboxEvent.publicado.is_(False))
                    .order_by(OutboxEvent.criado_em)
                    .limit(100)
                    .all()
                )
                for evento in pendentes:
                    await exchange.publish(
                        aio_pika.Message(evento.payload.encode(), message_id=evento.evento_id,
                                         content_type="application/json",
                                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=evento.routing_key)
                    evento.publicado = True
                    evento.publicado_em = datetime.utcnow()
                    session.commit()
            finally:
                session.close()
            if not pendentes:
                await asyncio.sleep(0.1)


class Poller:
    def __init__(self, engine, amqp_url):
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=lambda: asyncio.run(story_poller(engine, amqp_url, self.stop)), daemon=True)

    def start(self):
        self.thread.start()
        return [os.getpid()]

    def close(self):
        self.stop.set()
        self.thread.join(30)


# --- Carteiro ----------------------------------------------------------------------------

def carteiro_config(dir_: str, amqp_url: str, db_url: str, mode: str, name: str) -> str:
    path = os.path.join(dir_, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f"""version = 1
[broker]
url = "{amqp_url}"
[store]
url = "sqlite://{dir_}/{name}.db"
[relay]
enabled = false

[[outboxes]]
name = "{name}"
url = "{db_url}"
table = "outbox_events"
exchange = "{EXCHANGE}"
mode = "{mode}"

[outboxes.columns]
id = "id"
event_id = "evento_id"
type = "tipo"
routing_key = "routing_key"
payload = "payload"
published = "publicado"
published_at = "publicado_em"
created_at = "criado_em"
""")
    return path


class Carteiro:
    def __init__(self, binary, config, engine, slot=None):
        self.cmd = [binary, "relay", "-c", config]
        self.proc = None
        self.engine = engine
        self.slot = slot

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env={**os.environ, "CARTEIRO_LOG": "warn"})
        return [self.proc.pid]

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.slot:
            # A slot left behind would hold every later round's WAL for the next start.
            with self.engine.begin() as conn:
                conn.execute(text("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                  "WHERE slot_name = :s"), {"s": self.slot})


# --- the measurements ----------------------------------------------------------------------

def drain(engine, side, pg_port, rows):
    reset(engine, rows)
    pg = postgres_pids(pg_port)
    db_cpu0 = cpu_seconds(pg)
    t0 = time.monotonic()
    roots = side.start()
    relay_cpu0 = cpu_seconds(tree(roots)) if roots != [os.getpid()] else None
    while unpublished(engine) > 0:
        time.sleep(0.02)
        if time.monotonic() - t0 > 900:
            raise SystemExit("drain did not finish in 15 minutes")
    took = time.monotonic() - t0
    db_cpu = cpu_seconds(pg) - db_cpu0
    relay_cpu = cpu_seconds(tree(roots)) - relay_cpu0 if relay_cpu0 is not None else None
    side.close()
    return took, db_cpu, relay_cpu


async def latency(engine, side, amqp_url, rate, seconds):
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE outbox_events RESTART IDENTITY"))
    committed, received = {}, {}
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(QUEUE)
        await queue.purge()

        async def on_message(message):
            received.setdefault(message.message_id, time.time())
            await message.ack()

        await queue.consume(on_message)
        side.start()
        await asyncio.sleep(3)  # started and polling
        n = int(rate * seconds)
        t0 = time.monotonic()
        for i in range(n):
            evento_id = str(uuid.uuid4())
            with Session(engine) as s:
                s.add(OutboxEvent(evento_id=evento_id, tipo="matricula.confirmada",
                                  routing_key="matricula.confirmada", payload=payload(i)))
                s.commit()
            committed[evento_id] = time.time()
            lag = t0 + (i + 1) / rate - time.monotonic()
            if lag > 0:
                await asyncio.sleep(lag)
        deadline = time.monotonic() + 60
        while len(received.keys() & committed.keys()) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        side.close()
    ms = sorted((received[k] - committed[k]) * 1000 for k in committed if k in received)
    missing = n - len(ms)
    return ms, missing


def idle(side, pg_port, seconds):
    side.start()
    time.sleep(3)
    pg = postgres_pids(pg_port)
    cpu0 = cpu_seconds(pg)
    time.sleep(seconds)
    used = cpu_seconds(pg) - cpu0
    side.close()
    return used / seconds


def pct(ms, p):
    return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))] if ms else float("nan")


async def declare(amqp_url):
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(QUEUE, durable=True)
        await queue.bind(exchange, "#")
        await queue.purge()


async def purge(amqp_url):
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(QUEUE)
        await queue.purge()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--amqp", required=True)
    ap.add_argument("--pg", required=True, help="postgres://... of a database for the bench")
    ap.add_argument("--carteiro", required=True)
    ap.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_ROWS", 20000)))
    ap.add_argument("--poller-rows", type=int, default=int(os.environ.get("BENCH_POLLER_ROWS", 3000)))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 2)))
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--latency-s", type=float, default=10)
    ap.add_argument("--idle-s", type=float, default=30)
    args = ap.parse_args()
    pg_port = int(args.pg.rsplit(":", 1)[1].split("/")[0])
    engine = create_engine(args.pg.replace("postgres://", "postgresql+psycopg2://", 1), pool_size=4)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE INDEX IF NOT EXISTS outbox_events_unpublished_idx "
                          "ON outbox_events (id) WHERE NOT publicado"))
    asyncio.run(declare(args.amqp))
    tmp = tempfile.mkdtemp(prefix="bench-outbox-")
    sides = {
        "story poller": lambda: Poller(engine, args.amqp),
        "carteiro poll": lambda: Carteiro(
            args.carteiro, carteiro_config(tmp, args.amqp, args.pg, "poll", "bench_poll"), engine),
        "carteiro cdc": lambda: Carteiro(
            args.carteiro, carteiro_config(tmp, args.amqp, args.pg, "cdc", "bench_cdc"), engine,
            slot="carteiro_bench_cdc"),
    }
    print(f"# outbox relay bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# load before: {open('/proc/loadavg').read().strip()}")
    print(f"# rows: {args.rows} per Carteiro drain, {args.poller_rows} per poller drain; rounds {args.rounds}")
    print("\n## drain (pending rows, start to last row marked)")
    print("| side | round | rows | seconds | rows/s | db CPU ms/row | relay CPU ms/row |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rates = {k: [] for k in sides}
    for r in range(args.rounds):
        for name, make in sides.items():
            rows = args.poller_rows if name == "story poller" else args.rows
            took, db_cpu, relay_cpu = drain(engine, make(), pg_port, rows)
            asyncio.run(purge(args.amqp))
            rates[name].append(rows / took)
            relay = f"{relay_cpu * 1000 / rows:.3f}" if relay_cpu is not None else "-"
            print(f"| {name} | {r + 1} | {rows} | {took:.2f} | {rows / took:.0f} | {db_cpu * 1000 / rows:.3f} | {relay} |", flush=True)
    base = statistics.mean(rates["story poller"])
    for name in ("carteiro poll", "carteiro cdc"):
        print(f"\n{name}: {statistics.mean(rates[name]):.0f} rows/s = {statistics.mean(rates[name]) / base:.1f}x the story's poller ({base:.0f} rows/s)")
    print(f"\n## commit-to-publish ({args.rate:.0f} rows/s for {args.latency_s:.0f} s, one commit per row)")
    print("| side | p50 ms | p99 ms | max ms | missing |")
    print("|---|---:|---:|---:|---:|")
    for name, make in sides.items():
        ms, missing = asyncio.run(latency(engine, make(), args.amqp, args.rate, args.latency_s))
        print(f"| {name} | {pct(ms, 50):.1f} | {pct(ms, 99):.1f} | {ms[-1] if ms else float('nan'):.1f} | {missing} |", flush=True)
    print(f"\n## idle ({args.idle_s:.0f} s on an empty table): PostgreSQL CPU")
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE outbox_events RESTART IDENTITY"))
    for name, make in sides.items():
        print(f"- {name}: {idle(make(), pg_port, args.idle_s) * 100:.2f} % of a core", flush=True)
    print(f"\n# load after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
