"""Where the gateway's CPU goes per message: runs the real `carteiro run` (release) on the
Rust enrollment route against a backlog of N messages, samples it with `perf record`
(cpu-clock, the whole process, start-up included), and sums the samples by stage: the
database (SQLite's C code, sqlx, the PostgreSQL driver), AMQP (lapin, amq-protocol), the
sandbox (wasmtime and the guest's compiled code), the runtime (tokio, futures), memory
(allocator), serialisation, the binary's other code (Carteiro's own, with what the
compiler inlined into it), and the rest.

    python stages.py BINARY PLUGINS AMQP_URL STORE {relay-on|relay-off|table} [N]

`table` is relay on with `[relay] immediate = false` (every row claimed back from the
table: the relay before immediate dispatch). Prints one Markdown table; the caller
(bench/run.sh profile) runs each variant and keeps the report.
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aio_pika

# First matching rule names a symbol's stage; checked against "dso symbol".
STAGES = [
    ("database", r"sqlite3|sqlx|libsqlite|postgres|tokio_postgres|\bpq\b"),
    ("AMQP (lapin, amq-protocol)", r"lapin|amq_protocol|async_rs|pinky_swear|flume"),
    ("TLS and crypto", r"rustls|aws_lc|ring::"),
    ("sandbox (wasmtime, guest code)", r"wasmtime|cranelift|wasmparser|wasm-function|\[JIT\]|jitted|perf-\d+\.map|cap_std|wasi"),
    ("memory (allocator, copies)", r"malloc|free|realloc|memcpy|memmove|memset|_int_|cfree|alloc::"),
    ("serialisation (serde, json, uuid)", r"serde|json|uuid|base64|hex::"),
    ("async runtime (tokio, futures)", r"tokio|futures|mio::|parking_lot|crossbeam"),
    # Any other symbol of the gateway binary: Carteiro's code and what was inlined into it.
    ("the binary's other code (Carteiro, inlined std and crates)", r"carteiro"),
    ("kernel (syscalls, network, fsync)", r"\[kernel|\[k\]|vmlinux|entry_SYSCALL|__x64_sys|syscall"),
    ("libc and std", r"libc|std::|core::"),
]


def config(plugins, amqp, store, queue, events, mode):
    relay = {"relay-on": "", "relay-off": "enabled = false\n", "table": "immediate = false\n"}[mode]
    return f"""
version = 1
[broker]
url = "{amqp}"
[store]
url = "{store}"
[admin]
listen = ""
[relay]
{relay}
[plugins.p]
path = "{plugins}/enrollment.wasm"
[plugins.p.variables]
events_exchange = "{events}"
[[routes]]
queue = "{queue}"
plugin = "p"
prefetch = 64
idempotency_key = "message_id"
"""


async def backlog(amqp, queue, events, n):
    conn = await aio_pika.connect_robust(amqp)
    ch = await conn.channel()
    ex = await ch.declare_exchange(events, aio_pika.ExchangeType.TOPIC, durable=True)
    sink = await ch.declare_queue(f"{events}.sink", durable=True)
    await sink.bind(ex, "#")
    dlx = await ch.declare_exchange(f"{queue}.dlx", aio_pika.ExchangeType.FANOUT, durable=True)
    dlq = await ch.declare_queue(f"{queue}.dlq", durable=True)
    await dlq.bind(dlx, "")
    await ch.declare_queue(queue, durable=True, arguments={"x-dead-letter-exchange": f"{queue}.dlx"})
    for i in range(n):
        mid = f"p{i}"
        body = json.dumps({"matricula_id": mid, "usuario_id": f"U{mid}", "curso_id": "C1"}).encode()
        await ch.default_exchange.publish(
            aio_pika.Message(body, message_id=mid, content_type="application/json"), routing_key=queue)
    return conn, ch


async def wait_drained(gw, ch, queue, events, n, with_events, limit=300):
    deadline = time.time() + limit
    while time.time() < deadline:
        if gw.poll() is not None:
            raise SystemExit(f"carteiro exited with {gw.returncode}; see its log")
        q = await ch.declare_queue(queue, passive=True)
        s = await ch.declare_queue(f"{events}.sink", passive=True)
        if q.declaration_result.message_count == 0 and (
                not with_events or s.declaration_result.message_count >= 3 * n):
            if not with_events:
                await asyncio.sleep(1)  # the last prefetched deliveries commit and ack
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"not drained within {limit}s")


async def cleanup(conn, queue, events):
    for name in (queue, f"{queue}.dlq", f"{events}.sink"):
        async with conn.channel() as c:
            await c.queue_delete(name)
    for name in (f"{queue}.dlx", events):
        async with conn.channel() as c:
            await c.exchange_delete(name)
    await conn.close()


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stage_of(line):
    for name, pattern in STAGES:
        if re.search(pattern, line):
            return name
    return "other"


def summarise(data):
    out = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "dso,sym",
         "-g", "none", "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    totals = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.*)", line)
        if m:
            stage = stage_of(m.group(2))
            totals[stage] = totals.get(stage, 0.0) + float(m.group(1))
    return totals


async def main():
    binary, plugins, amqp, store_kind, mode = sys.argv[1:6]
    binary, plugins = str(Path(binary).resolve()), str(Path(plugins).resolve())
    n = int(sys.argv[6]) if len(sys.argv) > 6 else 3000
    tag = uuid.uuid4().hex[:8]
    queue, events = f"profile.{tag}", f"profile.{tag}.events"
    work = Path(tempfile.mkdtemp(prefix="carteiro-profile-"))
    store = f"sqlite://{work}/carteiro.db" if store_kind == "sqlite" else store_kind
    cfg = work / "carteiro.toml"
    cfg.write_text(config(plugins, amqp, store, queue, events, mode))
    conn, ch = await backlog(amqp, queue, events, n)
    data = str(work / "perf.data")
    start = time.time()
    gw = subprocess.Popen([binary, "run", "--config", str(cfg)],
                          stdout=open(work / "carteiro.log", "wb"), stderr=subprocess.STDOUT)
    # PROFILE_CALLGRAPH=dwarf keeps call chains (the release binary has no frame pointers).
    graph = ["--call-graph", os.environ["PROFILE_CALLGRAPH"]] if os.environ.get(
        "PROFILE_CALLGRAPH") else ["-g"]
    perf = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "1999", *graph, "-p",
                             str(gw.pid), "-o", data], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        await wait_drained(gw, ch, queue, events, n, mode != "relay-off")
        wall = time.time() - start
        cpu = cpu_seconds(gw.pid)
    finally:
        gw.terminate()
        gw.wait(timeout=30)
        perf.wait(timeout=60)
        await cleanup(conn, queue, events)
    totals = summarise(data)
    print(f"<!-- perf data: {data} -->")
    per_msg_us = cpu / n * 1e6
    print(f"### {mode}, {'SQLite' if store_kind == 'sqlite' else 'PostgreSQL'}: "
          f"{n} messages in {wall:.1f} s, gateway CPU {cpu:.2f} s = {per_msg_us:.0f} µs/message\n")
    print("| stage | share | µs/message |\n|---|---:|---:|")
    for stage, pct in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| {stage} | {pct:.1f} % | {per_msg_us * pct / 100:.0f} |")
    print()


asyncio.run(main())
