"""Peers bench driver: Carteiro against the systems teams use instead, side by side.

For each round, each system in turn (A B C ... A B C ...), on the same broker, the same
message set and the same prefetch, with a fresh queue and a fresh database per run:
1. throughput: N enrollment messages are published (confirmed) before the system starts;
   msg/s from its first commit until all N business rows are committed and all 3N outbox
   rows are marked published (times read from the system's own database; a Carteiro route
   with the relay off: until the rows are committed; the baselines: first to last ack);
   CPU per message: the system's processes' whole CPU from their start (start-up included)
   until then, ÷ N; the broker's and the PostgreSQL server's over the same span (/proc
   utime+stime with reaped children; both servers are shared with other users of this box,
   so their figures include whatever else ran meanwhile); peak RSS (VmHWM) of the system's
   processes.
2. latency: with the system idle, L messages paced at RATE msg/s; end-to-end latency =
   commit time recorded in the business row - publish time (both wall clock, ms).
Then once per system (one Carteiro system per backend), a failure mix on a fresh run: M
messages, 10% failing transiently once, 5% poison, 5% published twice; the final state must
hold every effect exactly once and every poison message dead-lettered. The lapin baseline
must leave exactly 3N events on the sink. Any difference fails the run (exit 1). `uptime`
before each round and the command that repeats the run go into the result file
(report.py: the table, and the ratios issue 38's goals name).

    python run.py [--smoke]       (bench/run.sh peers installs the venv and calls this)

Knobs (environment): BENCH_MESSAGES (N, 3000), BENCH_ROUNDS (3), BENCH_PREFETCH (64),
BENCH_LATENCY_MESSAGES (L, 100), BENCH_LATENCY_RATE (20 msg/s: below the slowest peer's
throughput on this box, so the figure is latency, not queueing), BENCH_MIX_MESSAGES (M, 400),
BENCH_SYSTEMS (ALL below; also carteiro-relay-off-postgres and the -postgres forms of the
Python and JS routes), BENCH_REUSE (64: the -batch routes' reuse), BENCH_MAX_LOAD (unset:
wait before each round, up to BENCH_LOAD_WAIT_S (600) s, for a 1-minute load under it),
BENCH_SEED (the failure mix), BENCH_SMOKE=1 (= --smoke: N=100, 1 round, L=10, M=200).
Needed: CARTEIRO_TEST_AMQP_URL, CARTEIRO_TEST_POSTGRES_URL, CARTEIRO_BIN, CARTEIRO_PLUGINS,
CARTEIRO_LAPIN_BASELINE (the lapin-baseline binary, for that system).
"""

import asyncio
import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import aio_pika

import procfs
import report
import systems as sysmod
from business import now_ms

REPO = Path(__file__).resolve().parents[2]
ALL = ("lapin-baseline,carteiro-sqlite,carteiro-relay-off-sqlite,"
       "carteiro-py-sqlite,carteiro-py-batch-sqlite,carteiro-js-sqlite,carteiro-js-batch-sqlite,"
       "pattern-sqlite,celery-sqlite,carteiro-postgres,pattern-postgres,celery-postgres,"
       "baseline")


def knob(name, default, smoke_value=None):
    if smoke_value is not None and SMOKE:
        return smoke_value
    return int(os.environ.get(name, default))


SMOKE = "--smoke" in sys.argv or os.environ.get("BENCH_SMOKE") == "1"
N = knob("BENCH_MESSAGES", 3000, 100)
ROUNDS = knob("BENCH_ROUNDS", 3, 1)
PREFETCH = knob("BENCH_PREFETCH", 64)
LAT_N = knob("BENCH_LATENCY_MESSAGES", 100, 10)
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


def is_baseline(system):
    return system.kind == "baseline"


async def throughput(system, rnd):
    async def body(run, channel, procs):
        await publish(channel, system, [(f"B{i}", "ok") for i in range(N)])
        # CPU is counted from the system's start (start-up included); the servers' from then.
        _, broker0, pg0 = cpu_sample([])
        procs += (system.start(run, mix=False, expect=N) if is_baseline(system)
                  else system.start(run, mix=False))
        timeout = 60 + N / 5
        if is_baseline(system):
            done_file = run.dir / "done"
            await wait_for(done_file.exists, procs, timeout, system.name)
            after = cpu_sample(procs)
            t = json.loads(done_file.read_text())
            first_ms, end_ms = t["first_ms"], t["last_ms"]
            wrong = await system.check(run, channel, N)
            if wrong:
                raise Failed(f"{system.name}: {wrong}; see {run.dir}")
            lat = []
        else:
            relayed = getattr(system, "relay", True)  # relay off: the rows stay pending

            def finished():
                rows, pending, _ = system.outbox(run)
                return (system.done(run, "B") == N and rows == 3 * N
                        and (pending == 0 or not relayed))

            await wait_for(finished, procs, timeout, system.name)
            after = cpu_sample(procs)
            times = system.commit_times(run, "B")
            first_ms = min(times.values())
            end_ms = max(times.values())
            rows, pending, last_publish = system.outbox(run)
            if relayed:
                end_ms = max(end_ms, last_publish)
            elif pending != rows:
                raise Failed(f"{system.name}: {rows - pending} outbox rows published with the "
                             f"relay off; see {run.dir}")
            sent = await publish(channel, system, [(f"L{i}", "ok") for i in range(LAT_N)],
                                 rate=LAT_RATE)
            await wait_for(lambda: system.done(run, "L") == LAT_N, procs, 60 + LAT_N / 5,
                           f"{system.name} latency")
            done = system.commit_times(run, "L")
            lat = sorted(done[m] - sent[m] for m in sent)
        # ms of CPU per message (= s per 1,000).
        per_msg = [after[0] / N * 1000, (after[1] - broker0) / N * 1000,
                   (after[2] - pg0) / N * 1000]
        rss = procfs.peak_rss_mib(procfs.tree([p.pid for p in procs]))
        result = {
            "rate": N / max(0.001, (end_ms - first_ms) / 1000),
            "cpu": per_msg[0], "broker": per_msg[1], "pg": per_msg[2], "rss": rss,
            "p50": lat[len(lat) // 2] if lat else None,
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        }
        print(f"  {system.name:26} round {rnd}: {result['rate']:8.0f} msg/s, "
              f"cpu {per_msg[0]:.3f} ms/msg (broker {per_msg[1]:.3f}, pg {per_msg[2]:.3f}), "
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


def warm_compile_cache(chosen):
    """Each Carteiro route's plugin compiled once before the rounds (a cold cache would put
    a compile into the first round's start-up CPU only)."""
    workdir = REPO / ".local" / "peers" / f"warm_{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True)
    try:
        for s in chosen:
            if s.kind == "carteiro":
                s.warm(sysmod.Run(s, workdir.name, workdir,
                                  os.environ["CARTEIRO_TEST_AMQP_URL"],
                                  os.environ["CARTEIRO_TEST_POSTGRES_URL"], PREFETCH))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


async def wait_for_quiet():
    """With BENCH_MAX_LOAD set: waits (up to BENCH_LOAD_WAIT_S, 600) for the 1-minute load
    average to fall under it before a round."""
    limit = os.environ.get("BENCH_MAX_LOAD")
    if not limit:
        return
    deadline = time.monotonic() + knob("BENCH_LOAD_WAIT_S", 600)
    while os.getloadavg()[0] >= float(limit) and time.monotonic() < deadline:
        await asyncio.sleep(5)


def repeat_command(names):
    """The command that repeats this run, with every knob that was set."""
    knobs = {"BENCH_ROUNDS": ROUNDS, "BENCH_MESSAGES": N, "BENCH_PREFETCH": PREFETCH,
             "BENCH_SYSTEMS": ",".join(names)}
    for name in ("BENCH_REUSE", "BENCH_LATENCY_MESSAGES", "BENCH_LATENCY_RATE",
                 "BENCH_MIX_MESSAGES", "BENCH_MAX_LOAD", "BENCH_LOAD_WAIT_S"):
        if os.environ.get(name):
            knobs[name] = os.environ[name]
    return " ".join(f"{k}={v}" for k, v in knobs.items()) + " bench/run.sh peers" + (
        " --smoke" if SMOKE else "")


def commit():
    git = ["git", "-C", str(REPO)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "?"
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def render(chosen, names, results, mix, loads, started):
    build = "debug" if "/debug/" in os.environ["CARTEIRO_BIN"] else "release"
    med = report.medians(chosen, results)
    lines = [
        f"# Peers bench, {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"Commit {commit()}, {build} build. Command:",
        "",
        "```",
        repeat_command(names),
        "```",
        "",
        f"{os.cpu_count()} cores, {N} messages per run, {ROUNDS} round(s) alternating the "
        f"systems, prefetch {PREFETCH}; latency: {LAT_N} messages at {LAT_RATE} msg/s; failure "
        f"mix: {MIX_N} messages. Medians over rounds. CPU per message: the system's processes "
        f"from their start (start-up included) until its {N} messages are done, ÷ {N}; "
        f"broker and PostgreSQL over the same span (shared servers: other users' work "
        f"included). The Python and JavaScript routes: `[plugins.NAME]` with `path` and "
        f"`memory` only, and `-batch` with `isolation = \"per-batch\"`, "
        f"`reuse = {os.environ.get('BENCH_REUSE', '64')}` too.",
        "",
    ]
    lines += [f"Load before round {i}: `{load}`" for i, load in enumerate(loads, 1)]
    lines += [""] + report.systems_table(chosen, med, mix) + [""]
    lines += report.goals_table(chosen, med)
    lines += [""] + report.per_round(results)
    return "\n".join(lines) + "\n"


async def main():
    names = os.environ.get("BENCH_SYSTEMS", ALL).split(",")
    chosen = sysmod.systems(names, os.environ["CARTEIRO_BIN"], os.environ["CARTEIRO_PLUGINS"],
                            os.environ.get("CARTEIRO_LAPIN_BASELINE"))
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"peers: {', '.join(s.name for s in chosen)}; {N} messages, {ROUNDS} round(s), "
          f"prefetch {PREFETCH}{', smoke' if SMOKE else ''}", flush=True)
    results = {s.name: [] for s in chosen}
    mix, loads, failures = {}, [], []
    warm_compile_cache(chosen)
    for rnd in range(1, ROUNDS + 1):
        await wait_for_quiet()
        loads.append(uptime())
        print(f"round {rnd}, load before it: {loads[-1]}", flush=True)
        for s in chosen:
            try:
                results[s.name].append(await throughput(s, rnd))
            except Failed as e:
                failures.append(str(e))
                print(f"  {s.name}: FAILED: {e}", flush=True)
    seed = int(os.environ.get("BENCH_SEED", random.randrange(1 << 30)))
    print(f"failure mix (seed {seed}, BENCH_SEED replays it)", flush=True)
    for s in chosen:
        # One Carteiro mix per backend: every Carteiro row of a backend runs the same Rust
        # fixture on the same gateway (languages and the relay do not change the checks).
        if is_baseline(s) or (s.kind == "carteiro" and s.name != f"carteiro-{s.backend}"):
            continue
        try:
            mix[s.name] = await failure_mix(s, seed)
        except Failed as e:
            mix[s.name] = False
            failures.append(str(e))
            print(f"  {s.name}: FAILED: {e}", flush=True)
    table = render(chosen, names, results, mix, loads, started)
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
