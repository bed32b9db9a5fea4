"""The harness of the foreign dead-letter queue tests: the real `carteiro` binary (CARTEIRO_BIN),
the RabbitMQ of CARTEIRO_TEST_AMQP_URL, and the story's own Python services as subprocesses.
Every wait is bounded (WAIT seconds) and names what it waited for."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import aio_pika
import pytest

HERE = Path(__file__).parent
WAIT = float(os.environ.get("FOREIGN_DLQ_WAIT", "30"))
AMQP_URL = os.environ.get("CARTEIRO_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5673/%2f")
BIN = os.environ.get("CARTEIRO_BIN", "carteiro")


def wait_for(what, check, timeout=WAIT, every=0.2):
    """Polls `check` until it returns something truthy; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"waited {timeout}s for {what}; last: {last!r}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def amqp(coro_fn):
    """Runs `coro_fn(channel)` on a fresh aio-pika connection."""

    async def go():
        connection = await aio_pika.connect(AMQP_URL)
        async with connection:
            return await coro_fn(await connection.channel())

    return asyncio.run(go())


def delete_story(prefix):
    async def delete(channel):
        for queue in (f"{prefix}.processar", f"{prefix}.dlq"):
            await channel.queue_delete(queue)
        await channel.exchange_delete(f"{prefix}.dlx")

    amqp(delete)


def publish(routing_key, body, message_id=None, exchange="", headers=None):
    async def send(channel):
        target = await channel.get_exchange(exchange) if exchange else channel.default_exchange
        message = aio_pika.Message(body, message_id=message_id, headers=headers or {},
                                   delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await target.publish(message, routing_key=routing_key)

    amqp(send)


def queue_depth(queue):
    async def depth(channel):
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count

    return amqp(depth)


class Carteiro:
    """One `carteiro run` with `config` (a TOML text without its [broker], [store], [admin])."""

    def __init__(self, tmp: Path, config: str):
        self.tmp = tmp
        self.port = free_port()
        self.config = tmp / "carteiro.toml"
        self.config.write_text(
            f'version = 1\n[broker]\nurl = "{AMQP_URL}"\n'
            f'[store]\nurl = "sqlite://carteiro.db"\n'
            f'[admin]\nlisten = "127.0.0.1:{self.port}"\n{config}'
        )
        self.proc = None
        self.log = tmp / "carteiro.log"

    def cli(self, *args, check=True):
        done = subprocess.run([BIN, *args, "--config", str(self.config)], capture_output=True,
                              text=True, timeout=WAIT)
        if check and done.returncode != 0:
            raise AssertionError(f"carteiro {' '.join(args)} failed: {done.stderr}{done.stdout}")
        return done

    def start(self, fault=None):
        env = {**os.environ, "RUST_LOG": "info"}
        env.pop("CARTEIRO_FAULT", None)
        if fault:
            env["CARTEIRO_FAULT"] = fault
        self.proc = subprocess.Popen([BIN, "run", "--config", str(self.config)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     env=env)
        wait_for("carteiro's admin server", lambda: self.get("/healthz") is not None)
        return self

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            return e.read().decode()
        except OSError:
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=WAIT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.kill()

    def console_page(self, id_, screenshot=None):
        """The console's page of dead letter `id_`; with CARTEIRO_CONSOLE_SCREENSHOTS set, also
        a headless Chromium's picture of it, `<dir>/<screenshot>.png`."""
        path = f"/dead-letters/message/{id_}"
        shots = os.environ.get("CARTEIRO_CONSOLE_SCREENSHOTS")
        if screenshot and shots:
            out = Path(shots) / f"{screenshot}.png"
            subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", "--window-size=1280,1500",
                            f"--screenshot={out}", f"http://127.0.0.1:{self.port}{path}"],
                           capture_output=True, timeout=60, check=True)
        return self.get(path)

    def dead_letters(self, *args):
        out = self.cli("dlq", "list", "--json", "--limit", "10000", *args).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def show(self, id_):
        return json.loads(self.cli("dlq", "show", str(id_)).stdout)


class Service:
    """A Python service of the story (a script of this folder, or a command), as a subprocess."""

    def __init__(self, tmp: Path, args, env, ready=None):
        self.log = tmp / f"service-{uuid.uuid4().hex[:6]}.log"
        self.proc = subprocess.Popen(args, cwd=HERE, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, env={**os.environ, **env})
        if ready:
            wait_for(f"{args} to print {ready!r}", lambda: ready in self.log.read_text())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item.failed_call = outcome.get_result().failed


@pytest.fixture
def running(tmp_path, request):
    """Starts things and stops them all after the test, dumping their logs on failure."""
    started = []

    def carteiro(config):
        c = Carteiro(tmp_path, config)
        started.append(c)
        return c

    def service(args, env, ready=None):
        s = Service(tmp_path, args, env, ready)
        started.append(s)
        return s

    yield carteiro, service
    for thing in reversed(started):
        thing.stop()
    if getattr(request.node, "failed_call", True):
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"---- {log.name}\n{log.read_text()[-3000:]}\n")


def story_consumer(service, tmp, prefix, fixed=False, queue_type="classic"):
    processed = tmp / f"processed-{prefix}-{int(fixed)}.txt"
    processed.touch()
    env = {"AMQP_URL": AMQP_URL, "PREFIX": prefix, "QUEUE_TYPE": queue_type,
           "PROCESSED": str(processed), "FIXED": "1" if fixed else "0"}
    return service([sys.executable, "story_consumer.py"], env, ready="consuming"), processed
