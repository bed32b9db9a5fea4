"""Test handlers natively with plain ``pytest``: an in-memory mock host, no WebAssembly.

Outside WebAssembly every ``kv``, ``outbox``, ``config`` and logging call of the SDK goes
to the mock host. :func:`run` calls a handler the way the gateway does: kv writes and
events are kept only if the verdict is ack, and discarded otherwise::

    from carteiro import Message, Verdict, kv
    from carteiro.testing import MockHost

    def test_counts(mock_host: MockHost) -> None:      # fixture: a fresh mock per test
        out = mock_host.run(handle, Message.from_text("any", "hi"))
        assert out.verdict == Verdict.ack()
        assert mock_host.kv_text("seen") == "1"

The mock applies the gateway's own key and event rules (:mod:`carteiro.rules`) and raises
the same typed errors. It does not model timeouts, memory limits or concurrent re-runs: run
the built component with ``carteiro plugin test`` for those.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from carteiro import _registry as _handler
from carteiro._host import mock as _mock
from carteiro._batch import Batch, check_verdicts
from carteiro._host.mock import EmittedEvent, HostCallLimitExceeded, Limits, LogRecord
from carteiro.message import Message
from carteiro.verdict import Verdict

__all__ = [
    "EmittedEvent",
    "HostCallLimitExceeded",
    "Limits",
    "LogRecord",
    "MockHost",
    "Outcome",
    "run",
    "run_batch",
]


@dataclass
class Outcome:
    """What one :func:`run` produced."""

    #: The handler's verdict.
    verdict: Verdict
    #: Events the handler emitted, in order (committed only if the verdict is ack).
    events: list[EmittedEvent] = field(default_factory=list)
    #: kv changes by key: bytes written, or ``None`` for a delete (committed only on ack).
    kv_writes: dict[str, bytes | None] = field(default_factory=dict)
    #: Lines the handler logged (kept whatever the verdict).
    logs: list[LogRecord] = field(default_factory=list)

    def events_to(self, routing_key: str) -> list[EmittedEvent]:
        """The emitted events with this routing key."""
        return [e for e in self.events if e.routing_key == routing_key]


class MockHost:
    """The mock host's controls. Creating one resets the mock: each test starts clean.

    There is one mock per process (tests of one process run one at a time); the
    ``mock_host`` pytest fixture gives each test a fresh one.
    """

    def __init__(self) -> None:
        _mock.state = _mock.State()

    @property
    def limits(self) -> Limits:
        """The enforced limits (defaults = the gateway's); assign to change them."""
        return _mock.state.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        _mock.state.limits = limits

    def set_var(self, name: str, value: str) -> None:
        """Sets a config variable, as ``[plugins.NAME.variables]`` would."""
        _mock.state.vars[name] = value

    def remove_var(self, name: str) -> None:
        """Unsets a config variable."""
        _mock.state.vars.pop(name, None)

    def set_kv_unavailable(self, reason: str | None) -> None:
        """Makes kv reads fail with :class:`~carteiro.StoreUnavailable` carrying ``reason``.

        As on the real host, writes are buffered until commit, so they do not fail.
        ``None`` makes the store reachable again.
        """
        _mock.state.kv_unavailable = reason

    def kv_insert(self, key: str, value: bytes | str) -> None:
        """Seeds (or overwrites) a committed kv value."""
        _mock.state.kv[key] = value.encode("utf-8") if isinstance(value, str) else bytes(value)

    def kv(self, key: str) -> bytes | None:
        """The committed value under ``key``."""
        return _mock.state.kv.get(key)

    def kv_text(self, key: str) -> str | None:
        """The committed value under ``key`` as text (``None`` if missing or not UTF-8)."""
        raw = self.kv(key)
        try:
            return None if raw is None else raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def kv_json(self, key: str) -> Any:
        """The committed value under ``key`` decoded from JSON (``None`` if missing)."""
        raw = self.kv(key)
        return None if raw is None else json.loads(raw)

    def kv_entries(self) -> dict[str, bytes]:
        """Every committed kv entry."""
        return dict(_mock.state.kv)

    def events(self) -> list[EmittedEvent]:
        """Every committed event, in emission order."""
        return list(_mock.state.events)

    def logs(self) -> list[LogRecord]:
        """Every logged line since the mock was created."""
        return list(_mock.state.logs)

    def run(self, handler: Callable[[Message], Verdict], message: Message) -> Outcome:
        """Runs ``handler`` on ``message`` like the gateway: effects commit only on ack."""
        return run(handler, message)

    def run_batch(
        self, handler: Callable[[Batch], list[Verdict]], messages: list[Message]
    ) -> list[Outcome]:
        """Runs a batch ``handler`` like the gateway: each message's effects commit only if
        its own verdict is ack."""
        return run_batch(handler, messages)


def run(handler: Callable[[Message], Verdict], message: Message) -> Outcome:
    """Runs ``handler`` on ``message`` against the current mock host.

    Effects commit (stay visible in :class:`MockHost`) only if the verdict is ack. An
    exception from the handler propagates (on the real host it is a trap), as does
    :class:`HostCallLimitExceeded`; the mock's effects of that call are then discarded.
    A return value that is not a :class:`~carteiro.Verdict` raises :class:`TypeError`.
    """
    state = _mock.state
    kv_before = dict(state.kv)
    events_before, logs_before = len(state.events), len(state.logs)
    state.in_message, state.message_events, state.message_calls = True, 0, 0
    root = logging.getLogger()
    level_before = root.level
    root.setLevel(1)  # every level, trace included: the gateway filters levels itself
    committed = False
    try:
        verdict = _handler.check_verdict(handler, handler(message))
        committed = verdict.is_ack
        return Outcome(
            verdict=verdict,
            events=state.events[events_before:],
            kv_writes=_diff(kv_before, state.kv),
            logs=state.logs[logs_before:],
        )
    finally:
        root.setLevel(level_before)
        state.in_message, state.message_events = False, 0
        if not committed:
            state.kv = kv_before
            del state.events[events_before:]


def _diff(before: dict[str, bytes], after: dict[str, bytes]) -> dict[str, bytes | None]:
    writes: dict[str, bytes | None] = {k: v for k, v in after.items() if before.get(k) != v}
    writes.update({k: None for k in before if k not in after})
    return dict(sorted(writes.items()))


def run_batch(
    handler: Callable[[Batch], list[Verdict]], messages: list[Message]
) -> list[Outcome]:
    """Runs a batch ``handler`` on ``messages`` against the current mock host.

    One :class:`Outcome` per message, with the effects made while it was the current message
    of the :class:`~carteiro.Batch`; each acked message's kv writes and events commit, in
    message order, and the others' are discarded. A handler that returns another number of
    verdicts than messages gets, like on the gateway, a retry for every message and no
    effects. An exception propagates (a trap on the real host), discarding every effect.
    """
    state = _mock.state
    base = dict(state.kv)
    state.batch = _mock.MockBatch(
        items=[_mock.Parked(kv=dict(base)) for _ in messages],
        events_mark=len(state.events),
        logs_mark=len(state.logs),
    )
    state.in_message, state.message_events, state.message_calls = True, 0, 0
    root = logging.getLogger()
    level_before = root.level
    root.setLevel(1)
    try:
        verdicts = check_verdicts(handler, handler(Batch(list(messages))), len(messages))
        _mock.park()
        items = state.batch.items
    finally:
        root.setLevel(level_before)
        state.batch = None
        state.in_message, state.message_events = False, 0
        state.kv = dict(base)
    if len(verdicts) != len(messages):
        reason = f"the batch handler returned {len(verdicts)} verdicts for {len(messages)} messages"
        return [Outcome(verdict=Verdict.retry(reason)) for _ in messages]
    outcomes = []
    for verdict, item in zip(verdicts, items):
        writes = _diff(base, item.kv)
        state.logs.extend(item.logs)
        if verdict.is_ack:
            for key, value in writes.items():
                if value is None:
                    state.kv.pop(key, None)
                else:
                    state.kv[key] = value
            state.events.extend(item.events)
        outcomes.append(Outcome(verdict=verdict, events=item.events, kv_writes=writes, logs=item.logs))
    return outcomes
