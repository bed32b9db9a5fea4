"""The in-memory mock host used outside WebAssembly; :mod:`carteiro.testing` drives it.

It applies :mod:`carteiro.rules` (the gateway's own key and event checks) and raises the
same typed errors as the real host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carteiro import rules
from carteiro._host.event import Event
from carteiro.errors import (
    InvalidEvent,
    InvalidKey,
    PayloadTooLarge,
    StoreUnavailable,
    TooManyEvents,
    ValueTooLarge,
)

LEVEL_NAMES = ("trace", "debug", "info", "warn", "error")


class HostCallLimitExceeded(BaseException):
    """The handler made more host calls than one delivery may.

    The real host traps the component; the mock raises this, a :class:`BaseException`,
    so that a handler's ``except Exception`` does not swallow it either.
    """


@dataclass
class Limits:
    """Limits the mock host enforces; the defaults are the gateway's."""

    #: Longest accepted kv key, in bytes.
    max_key_len: int = rules.MAX_KV_KEY_BYTES
    #: Largest accepted kv value, in bytes.
    max_value_len: int = rules.MAX_KV_VALUE_BYTES
    #: Most events one message may emit.
    max_events: int = 100
    #: Largest accepted event payload, in bytes.
    max_payload_len: int = rules.MAX_EVENT_PAYLOAD_BYTES
    #: Most host calls (kv, outbox, log, config) one message may make.
    max_host_calls: int = 10_000


@dataclass(frozen=True)
class EmittedEvent:
    """An event the handler emitted, with the id the mock host gave it."""

    id: str
    exchange: str
    routing_key: str
    headers: tuple[tuple[str, str], ...]
    content_type: str | None
    payload: bytes

    def header(self, name: str) -> str | None:
        """The first header called ``name``."""
        return next((v for n, v in self.headers if n == name), None)

    def json(self) -> object:
        """The payload decoded from JSON."""
        import json

        return json.loads(self.payload)


@dataclass(frozen=True)
class LogRecord:
    """One line the handler logged: ``level`` is trace, debug, info, warn or error."""

    level: str
    message: str


@dataclass
class State:
    """Everything the mock host holds."""

    kv: dict[str, bytes] = field(default_factory=dict)
    vars: dict[str, str] = field(default_factory=dict)
    events: list[EmittedEvent] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    kv_unavailable: str | None = None
    limits: Limits = field(default_factory=Limits)
    in_message: bool = False
    message_events: int = 0
    message_calls: int = 0
    next_event: int = 0
    #: Inside :func:`carteiro.testing.run_batch`: the other messages' state.
    batch: MockBatch | None = None


@dataclass
class Parked:
    """One message of a batch while another is current, as the real host keeps it."""

    kv: dict[str, bytes] = field(default_factory=dict)
    events: list[EmittedEvent] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    calls: int = 0
    event_count: int = 0


@dataclass
class MockBatch:
    """A batch being handled: one kv view, event and log list and count per message."""

    items: list[Parked]
    events_mark: int
    logs_mark: int
    current: int = 0


state = State()


def park() -> None:
    """Moves the current message's state into its parking place."""
    batch = state.batch
    if batch is None:
        return
    item = batch.items[batch.current]
    item.kv = dict(state.kv)
    item.events.extend(state.events[batch.events_mark :])
    del state.events[batch.events_mark :]
    item.logs.extend(state.logs[batch.logs_mark :])
    del state.logs[batch.logs_mark :]
    item.calls, item.event_count = state.message_calls, state.message_events


def batch_item(index: int) -> None:
    """Host calls from now on belong to message ``index`` (the real host traps on a bad one)."""
    _host_call()
    batch = state.batch
    if batch is None:
        raise RuntimeError("carteiro mock host: batch item outside a batch (the real host traps)")
    if not 0 <= index < len(batch.items):
        raise RuntimeError(
            f"carteiro mock host: batch item {index} in a batch of {len(batch.items)} "
            "(the real host traps)"
        )
    park()
    item = batch.items[index]
    state.kv = dict(item.kv)
    state.message_calls, state.message_events = item.calls, item.event_count
    batch.current = index


def _host_call() -> None:
    if not state.in_message:
        return
    state.message_calls += 1
    if state.message_calls > state.limits.max_host_calls:
        state.in_message = False
        raise HostCallLimitExceeded(
            f"carteiro mock host: the handler exceeded {state.limits.max_host_calls} host calls "
            "(the real host traps)"
        )


def _check_key(key: str) -> None:
    why = rules.kv_key_problem(key, state.limits.max_key_len)
    if why is not None:
        raise InvalidKey(why)


def kv_get(key: str) -> bytes | None:
    _host_call()
    _check_key(key)
    # Like the real host: only reads reach the store; writes are buffered until commit.
    if state.kv_unavailable is not None:
        raise StoreUnavailable(state.kv_unavailable)
    return state.kv.get(key)


def kv_set(key: str, value: bytes) -> None:
    _host_call()
    _check_key(key)
    if len(value) > state.limits.max_value_len:
        raise ValueTooLarge(state.limits.max_value_len)
    state.kv[key] = bytes(value)


def kv_delete(key: str) -> None:
    _host_call()
    _check_key(key)
    state.kv.pop(key, None)


def outbox_emit(event: Event) -> str:
    exchange, routing_key, headers, content_type, payload = event
    _host_call()
    if state.message_events >= state.limits.max_events:
        raise TooManyEvents(state.limits.max_events)
    why = rules.event_problem(exchange, routing_key, headers)
    if why is not None:
        raise InvalidEvent(why)
    if len(payload) > state.limits.max_payload_len:
        raise PayloadTooLarge(state.limits.max_payload_len)
    state.message_events += 1
    state.next_event += 1
    # Shaped like a UUIDv7 so code that parses ids keeps working in tests.
    event_id = f"00000000-0000-7000-8000-{state.next_event:012x}"
    state.events.append(
        EmittedEvent(event_id, exchange, routing_key, tuple(headers), content_type, bytes(payload))
    )
    return event_id


def log(level: int, message: str) -> None:
    _host_call()
    state.logs.append(LogRecord(LEVEL_NAMES[level], message))


def config_get(name: str) -> str | None:
    _host_call()
    return state.vars.get(name)


def config_all() -> list[tuple[str, str]]:
    _host_call()
    return sorted(state.vars.items())
