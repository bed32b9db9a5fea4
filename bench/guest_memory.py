"""Throughput against memory for a Python or JavaScript route: the real `carteiro run` on
the enrollment plugin (SQLite, relay on, the peers bench's prefetch), its `[plugins.p]`
entry giving only `path`, `memory` and each `max_concurrency` asked for (`default`: the
line left out). Runs the settings alternately, BENCH_ROUNDS rounds, with the peers bench's
throughput measure (bench/peers/run.py): msg/s, gateway CPU per 1,000 messages, peak RSS.

    BENCH_LANG=py GUEST_CONCURRENCY=default,2,3 BENCH_MESSAGES=2000 BENCH_ROUNDS=2 \\
        CARTEIRO_BIN=target/release/carteiro CARTEIRO_PLUGINS=target/plugins \\
        .local/peers-venv/bin/python bench/guest_memory.py

Needed as for the peers bench: CARTEIRO_TEST_AMQP_URL, CARTEIRO_TEST_POSTGRES_URL.
"""

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

import run as peers  # noqa: E402
import systems  # noqa: E402


class Route(systems.Carteiro):
    """The peers bench's Carteiro system with the plugin entry a Python team writes."""

    def __init__(self, binary, plugins, lang, concurrency):
        super().__init__("sqlite", binary, plugins, lang)
        self.concurrency = concurrency
        self.name = f"{lang} max_concurrency={concurrency}"

    def start(self, run, mix):
        plugin = {"path": f"{self.plugins}/enrollment-{self.lang}.wasm", "memory": "64MiB"}
        if self.concurrency != "default":
            plugin["max_concurrency"] = int(self.concurrency)
        tables = [
            ("broker", {"url": run.amqp_url}),
            ("store", {"url": f"sqlite://{run.sqlite_path}"}),
            ("admin", {"listen": ""}),
            ("plugins.p", plugin),
            ("plugins.p.variables", {"events_exchange": run.events}),
            ("[routes]", {"queue": run.queue, "plugin": "p", "prefetch": run.prefetch,
                          "idempotency_key": "message_id"}),
        ]
        # JSON strings and integers are TOML's too.
        config = "version = 1\n" + "".join(
            f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())
            for name, keys in tables)
        path = run.dir / "carteiro.toml"
        path.write_text(config)
        log = open(run.dir / "carteiro.log", "ab")
        return [subprocess.Popen([str(self.binary), "run", "--config", str(path)],
                                 stdout=log, stderr=log, start_new_session=True)]


async def main():
    lang = os.environ.get("BENCH_LANG", "py")
    settings = os.environ.get("GUEST_CONCURRENCY", "default,2,3").split(",")
    routes = [Route(Path(os.environ["CARTEIRO_BIN"]), Path(os.environ["CARTEIRO_PLUGINS"]),
                    lang, s) for s in settings]
    print(f"{lang}: {peers.N} messages, prefetch {peers.PREFETCH}, {peers.ROUNDS} rounds, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    results = {r.name: [] for r in routes}
    for rnd in range(peers.ROUNDS):
        for route in routes:
            results[route.name].append(await peers.throughput(route, rnd))
    print("| setting | msg/s | gateway CPU s/1k | peak RSS MiB |\n|---|---:|---:|---:|")
    for name, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("rate", "cpu", "rss")}
        print(f"| {name} | {med['rate']:.0f} | {med['cpu']:.2f} | {med['rss']:.0f} |")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
