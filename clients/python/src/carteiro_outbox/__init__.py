"""The service side of Carteiro's ``[[outboxes]]``.

Layout:

- ``outbox``: :class:`OutboxMixin` (the outbox table and its partial index on unpublished
  rows) and :func:`add_event`, which adds an event to the caller's transaction;
- ``inbox``: :class:`InboxMixin` and :func:`claim`, which a consumer calls in the
  transaction of a message's effects so that they apply once; :func:`prune`;
- ``config``: the ``[[outboxes]]`` block for a model (``python -m carteiro_outbox config``);
- ``ids``: UUIDv7 event ids.

Nothing here opens a connection or commits: the caller's session and transaction do.
"""

from .config import outbox_config
from .ids import new_event_id
from .inbox import InboxMixin, claim, prune
from .outbox import STORY_COLUMNS, OutboxMixin, add_event, outbox_indexes

__all__ = [
    "STORY_COLUMNS",
    "InboxMixin",
    "OutboxMixin",
    "add_event",
    "claim",
    "new_event_id",
    "outbox_config",
    "outbox_indexes",
    "prune",
]
