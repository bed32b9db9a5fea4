"""Peers bench driver: Carteiro against the systems teams use instead, side by side.

For each round, each system in turn (A B C ... A B C ...), on the same broker, the same
message set and the same prefetch, with a fresh queue and a fresh database per run:
1. throughput: N enrollment messages are published (confirmed) before the system starts;
   msg/s from its first commit until all N business rows are committed and all 3N outbox
   rows are marked published (times read from the system's own database);
   CPU seconds per 1,000 messages over that window for the system's processes, the broker
   and the PostgreSQL server (/proc utime+stime; both servers are shared with other users
   of this box, so their figures include whatever else ran meanwhile); peak RSS (VmHWM)
   of the system's processes.
2. latency: with the system idle, L messages paced at RATE msg/s; end-to-end latency =
   commit time recorded in the business row - publish time (both wall clock, ms).
Then once per system, a failure mix on a fresh run: M messages, 10% failing transiently
once, 5% poison, 5% published twice; the final state must hold every effect exactly once
and every poison message dead-lettered. Any difference fails the run (exit 1).

    python run.py [--smoke]       (bench/run.sh peers installs the venv and calls this)

Knobs (environment): BENCH_MESSAGES (N, 2000), BENCH_ROUNDS (3), BENCH_PREFETCH (64),
BENCH_LATENCY_MESSAGES (L, 100), BENCH_LATENCY_RATE (20 msg/s: below the slowest peer's
throughput on this box, so the figure is latency, not queueing), BENCH_MIX_MESSAGES (M, 400),
BENCH_SYSTEMS (all; also carteiro-py-sqlite, carteiro-js-sqlite, carteiro-py-postgres,
carteiro-js-postgres: the Python or JS enrollment handler on reused instances, BENCH_REUSE
(64) deliveries each), BENCH_SMOKE=1 (= --smoke: N=200, 1 round, L=20, M=200).
Needed: CARTEIRO_TEST_AMQP_URL, CARTEIRO_TEST_POSTGRES_URL, CARTEIRO_BIN, CARTEIRO_PLUGINS.
"""

import asyncio
import datetime
import json
import os
import random
import shutil
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import aio_pika

import procfs
import systems as sysmod
from business import now_ms

REPO = Path(__file__).resolve().parents[2]
ALL = ("carteiro-sqlite,pattern-sqlite,celery-sqlite,"
       "carteiro-postgres,pattern-postgres,celery-postgres,baseline")


def knob(name, default, smoke_value=None):
    if smoke_value is not None and SMOKE:
        return smoke_value
    return int(os.environ.get(name, default))


SMOKE = "--smoke" in sys.argv or os.environ.get("BENCH_SMOKE") == "1"
N = knob("BENCH_MESSAGES", 2000, 200)
ROUNDS = knob("BENCH_ROUNDS", 3, 1)
PREFETCH = knob("BENCH_PREFETCH", 64)
LAT_N = knob("BENCH_LATENCY_MESSAGES", 100, 20)
LAT_RATE = knob("BENCH_LATENCY_RATE", 20)
MIX_N = knob("BENCH_MIX_MESSAGES", 400, 200)
POLL_S = 0.1


class Failed(Exception):
    pass


async def publish(channel, system, items, mix=False, rate=None):
    """Publishes (message id, kind) items with confirms; returns id -> publish time (ms).
    Without a rate, 256 at a time in flight; with one, paced one by one."""
    sent = {}
    if rate:
        start = time.monotonic()
        for i, (mid, kind) in enumerate(items):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            sent[mid] = now_ms()
            await channel.default_exchange.publish(system.message(mid, kind, mix), routing_key=RUN.queue)
        return sent
    for at in range(0, len(items), 256):
        chunk = items[at:at + 256]
        for mid, _ in chunk:
            sent[mid] = now_ms()
        await asyncio.gather(*(channel.default_exchange.publish(
            system.message(mid, kind, mix), routing_key=RUN.queue) for mid, kind in chunk))
    return sent


def stop(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def servers():
    amqp = urlparse(os.environ["CARTEIRO_TEST_AMQP_URL"])
    pg = urlparse(os.environ["CARTEIRO_TEST_POSTGRES_URL"])
    return procfs.broker_pids(amqp.port or 5672), procfs.postgres_pids(pg.port or 5432)


def cpu_sample(procs):
    broker, pg = servers()
    return (procfs.cpu_seconds(procfs.tree([p.pid for p in procs])),
            procfs.cpu_seconds(broker), procfs.cpu_seconds(pg))


def alive(procs, what):
    for p in procs:
        if p.poll() is not None:
            raise Failed(f"{what} exited with {p.returncode}; see {RUN.dir}")


async def wait_for(cond, procs, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except sysmod.NotReady:
            value = None
        if value:
            return value
        alive(procs, what)
        if time.monotonic() > deadline:
            raise Failed(f"{what}: timed out after {timeout:.0f} s; see {RUN.dir}")
        await asyncio.sleep(POLL_S)


RUN = None  # the current run (publish() and the error messages name its queue and folder)


async def with_run(system, tag, body):
    """A fresh queue, database and folder for one run of `system`; cleaned afterwards."""
    global RUN
    run_id = f"peers_{tag}_{uuid.uuid4().hex[:8]}"
    workdir = REPO / ".local" / "peers" / run_id
    workdir.mkdir(parents=True)
    succeeded = False  # a failed run keeps its folder (logs, SQLite file) for a look
    RUN = sysmod.Run(system, run_id, workdir, os.environ["CARTEIRO_TEST_AMQP_URL"],
                     os.environ["CARTEIRO_TEST_POSTGRES_URL"], PREFETCH)
    connection = await aio_pika.connect(RUN.amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    procs = []
    try:
        if system.backend != "none":
            sysmod.create_database(RUN)
        await sysmod.declare_events(channel, RUN)
        await system.declare(channel, RUN)
        result = await body(RUN, channel, procs)
        succeeded = result is not False
        return result
    finally:
        stop(procs)
        await sysmod.clean_broker(connection, RUN)
        await connection.close()
        if system.backend != "none":
            sysmod.drop_database(RUN)
        if succeeded:
            shutil.rmtree(workdir, ignore_errors=True)


async def throughput(system, rnd):
    async def body(run, channel, procs):
        await publish(channel, system, [(f"B{i}", "ok") for i in range(N)])
        procs += (system.start(run, mix=False, expect=N) if system.kind == "baseline"
                  else system.start(run, mix=False))
        timeout = 60 + N / 5
        if system.kind == "baseline":
            first_file, done_file = run.dir / "done.first", run.dir / "done"
            await wait_for(first_file.exists, procs, timeout, system.name)
            at_first, before = 0, cpu_sample(procs)  # the window opens at its first ack
            await wait_for(done_file.exists, procs, timeout, system.name)
            t = json.loads(done_file.read_text())
            first_ms, end_ms, after = t["first_ms"], t["last_ms"], cpu_sample(procs)
            lat = []
        else:
            at_first = await wait_for(lambda: system.done(run, "B"), procs, timeout, system.name)
            before = cpu_sample(procs)

            def finished():
                rows, pending, _ = system.outbox(run)
                return system.done(run, "B") == N and rows == 3 * N and pending == 0

            await wait_for(finished, procs, timeout, system.name)
            after = cpu_sample(procs)
            times = system.commit_times(run, "B")
            first_ms = min(times.values())
            end_ms = max(max(times.values()), system.outbox(run)[2])
            sent = await publish(channel, system, [(f"L{i}", "ok") for i in range(LAT_N)],
                                 rate=LAT_RATE)
            await wait_for(lambda: system.done(run, "L") == LAT_N, procs, 60 + LAT_N / 5,
                           f"{system.name} latency")
            done = system.commit_times(run, "L")
            lat = sorted(done[m] - sent[m] for m in sent)
        counted = N - at_first
        per_k = [(b - a) / counted * 1000 for a, b in zip(before, after)]
        rss = procfs.peak_rss_mib(procfs.tree([p.pid for p in procs]))
        result = {
            "rate": N / max(0.001, (end_ms - first_ms) / 1000),
            "cpu": per_k[0], "broker": per_k[1], "pg": per_k[2], "rss": rss,
            "p50": lat[len(lat) // 2] if lat else None,
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        }
        print(f"  {system.name:18} round {rnd}: {result['rate']:8.0f} msg/s, "
              f"cpu/1k {per_k[0]:.2f} s (broker {per_k[1]:.2f}, pg {per_k[2]:.2f}), "
              f"p50 {result['p50']} ms p99 {result['p99']} ms, rss {rss:.0f} MiB", flush=True)
        return result

    return await with_run(system, f"r{rnd}", body)


def mix_items(seed):
    """M message ids with their kinds, and the duplicates re-published after them."""
    rng = random.Random(seed)
    items = []
    for i in range(MIX_N):
        r = rng.random()
        items.append((f"F{i}", "poison" if r < 0.05 else "transient" if r < 0.15 else "ok"))
    dups = [it for it in items if it[1] == "ok" and rng.random() < 0.05]
    return items, dups


async def failure_mix(system, seed):
    items, dups = mix_items(seed)
    good = sum(1 for _, k in items if k != "poison")
    poison = len(items) - good

    async def body(run, channel, procs):
        await publish(channel, system, items + dups, mix=True)
        procs += system.start(run, mix=True)

        async def settled():
            try:
                s = await system.final_state(run, channel, "F")
            except sysmod.NotReady:
                return None
            return s if s["effects"] >= good and s["dead"] >= poison else None

        deadline = time.monotonic() + 30 + MIX_N / 10
        while not (state := await settled()):
            alive(procs, system.name)
            if time.monotonic() > deadline:
                raise Failed(f"{system.name} failure mix: timed out; last state "
                             f"{await system.final_state(run, channel, 'F')}; see {run.dir}")
            await asyncio.sleep(POLL_S)
        if system.kind != "carteiro":
            await wait_for(lambda: system.outbox(run)[1] == 0, procs, 60, system.name)
        await asyncio.sleep(1.0)  # late duplicates, if any, would land now
        state = await system.final_state(run, channel, "F")
        want = {"effects": good, "rewrites": 0, "dead": poison,
                "events": None if system.kind == "carteiro" else 3 * good}
        ok = state == want
        print(f"  {system.name:18} failure mix ({len(items)} messages + {len(dups)} duplicates, "
              f"{poison} poison): {'PASS' if ok else 'FAIL'} {state}"
              + ("" if ok else f" expected {want}"), flush=True)
        return ok

    return await with_run(system, "mix", body)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    return "-" if v is None else f"{v:,.{digits}f}"


def report(chosen, results, mix, started):
    lines = [
        f"# Peers bench, {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"{os.cpu_count()} cores (a 2-core box shared with other builds: absolute figures are "
        f"noisy, read the ratios), {N} messages per run, {ROUNDS} round(s) alternating, "
        f"prefetch {PREFETCH}; latency: {LAT_N} messages at {LAT_RATE} msg/s; failure mix: "
        f"{MIX_N} messages. Medians over rounds. CPU is seconds per 1,000 messages; broker "
        f"and PostgreSQL are shared servers (other users' work included). Ratios: Carteiro "
        f"on the same backend ÷ the system (throughput), the system ÷ Carteiro (CPU).",
        "",
        "| system | msg/s | CPU s/1k (system) | broker | PostgreSQL | p50 ms | p99 ms | peak RSS MiB "
        "| Carteiro × throughput | Carteiro × less CPU | failure mix |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    med = {s.name: {k: median([r[k] for r in results[s.name]])
                    for k in ("rate", "cpu", "broker", "pg", "p50", "p99", "rss")}
           for s in chosen if results[s.name]}
    for s in chosen:
        if s.name not in med:
            continue
        m = med[s.name]
        ref = med.get(f"carteiro-{s.backend}") or med.get("carteiro-sqlite")
        x_rate = x_cpu = None
        if ref and not s.name.startswith("carteiro"):
            x_rate = ref["rate"] / m["rate"] if m["rate"] else None
            x_cpu = m["cpu"] / ref["cpu"] if ref["cpu"] else None
        verdict = {True: "pass", False: "FAIL", None: "-"}[mix.get(s.name)]
        lines.append(
            f"| {s.name} | {fmt(m['rate'])} | {fmt(m['cpu'], 2)} | {fmt(m['broker'], 2)} | "
            f"{fmt(m['pg'], 2) if s.backend == 'postgres' else '-'} | {fmt(m['p50'])} | "
            f"{fmt(m['p99'])} | {fmt(m['rss'])} | {fmt(x_rate, 2)} | {fmt(x_cpu, 2)} | {verdict} |")
    # A Python or JavaScript route against the hand-written Python it would replace.
    for s in chosen:
        lang = getattr(s, "lang", "rust")
        if lang == "rust" or s.name not in med:
            continue
        m = med[s.name]
        for peer in (f"pattern-{s.backend}", f"celery-{s.backend}"):
            if peer in med and med[peer]["rate"] and m["cpu"]:
                lines.append(
                    f"- {s.name} vs {peer}: {m['rate'] / med[peer]['rate']:.2f}x throughput, "
                    f"{med[peer]['cpu'] / m['cpu']:.2f}x less CPU per message")
    lines += ["", "Per round (msg/s): " + "; ".join(
        f"{name} " + " / ".join(fmt(r["rate"]) for r in rs) for name, rs in results.items())]
    return "\n".join(lines) + "\n"


async def main():
    names = os.environ.get("BENCH_SYSTEMS", ALL).split(",")
    chosen = sysmod.systems(names, os.environ["CARTEIRO_BIN"], os.environ["CARTEIRO_PLUGINS"])
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"peers: {', '.join(s.name for s in chosen)}; {N} messages, {ROUNDS} round(s), "
          f"prefetch {PREFETCH}{', smoke' if SMOKE else ''}", flush=True)
    results = {s.name: [] for s in chosen}
    mix = {}
    failures = []
    for rnd in range(1, ROUNDS + 1):
        for s in chosen:
            try:
                results[s.name].append(await throughput(s, rnd))
            except Failed as e:
                failures.append(str(e))
                print(f"  {s.name}: FAILED: {e}", flush=True)
    seed = int(os.environ.get("BENCH_SEED", random.randrange(1 << 30)))
    print(f"failure mix (seed {seed}, BENCH_SEED replays it)", flush=True)
    for s in chosen:
        # A Python or JS route's failure mix runs the same Rust fixture as carteiro-BACKEND.
        if s.kind == "baseline" or getattr(s, "lang", "rust") != "rust":
            continue
        try:
            mix[s.name] = await failure_mix(s, seed)
        except Failed as e:
            mix[s.name] = False
            failures.append(str(e))
            print(f"  {s.name}: FAILED: {e}", flush=True)
    table = report(chosen, results, mix, started)
    print(table)
    if not SMOKE:
        out = REPO / "bench" / "results" / f"peers-{started:%Y-%m-%dT%H%MZ}.md"
        out.parent.mkdir(exist_ok=True)
        out.write_text(table)
        print(f"peers: wrote {out.relative_to(REPO)}")
    bad = [n for n, ok in mix.items() if not ok]
    if failures or bad:
        print(f"peers: FAILED ({len(failures)} run error(s); failure mix failed for {bad})")
        return 1
    print("peers: PASSED" + (" (smoke)" if SMOKE else ""))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
