"""Routes the standard :mod:`logging` module to the host's ``log`` import.

Importing :mod:`carteiro` installs :class:`HostLogHandler` on the root logger, so
``logging.getLogger(__name__).info("...")`` reaches the gateway's tracing output tagged
with the plugin's name (and, natively, the mock host's captured logs). Each line is one
host call: do not log in a tight loop.
"""

from __future__ import annotations

import logging

from carteiro._host import backend

__all__ = ["HostLogHandler", "install"]

#: Python has no TRACE level; records below DEBUG are sent as trace.
_TRACE, _DEBUG, _INFO, _WARN, _ERROR = range(5)


def host_level(levelno: int) -> int:
    """The WIT log level (0 trace .. 4 error) for a :mod:`logging` level number."""
    if levelno < logging.DEBUG:
        return _TRACE
    if levelno < logging.INFO:
        return _DEBUG
    if levelno < logging.WARNING:
        return _INFO
    if levelno < logging.ERROR:
        return _WARN
    return _ERROR


class HostLogHandler(logging.Handler):
    """A :class:`logging.Handler` that sends each record to the host's ``log`` import."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a bad format string must not fail the delivery
            self.handleError(record)
            return
        backend.log(host_level(record.levelno), text)


def install() -> None:
    """Adds one :class:`HostLogHandler` to the root logger (idempotent)."""
    root = logging.getLogger()
    if not any(isinstance(h, HostLogHandler) for h in root.handlers):
        root.addHandler(HostLogHandler())
