"""The enrollment handler of ``plugins/enrollment-py``, as a batch handler.

Same effects per message as ``enrollment-py`` (its ``app.py`` is linked here as
``enrollment.py``): each message of a batch is confirmed by the same function, and its kv
record and three events commit only if its own verdict is ack. The gain is throughput: a
batch of N messages costs one instance and one call instead of N (a fresh Python instance
per message costs milliseconds; bench/README.md has the figures).
"""

from __future__ import annotations

import carteiro
from carteiro import Batch, Verdict

import enrollment


@carteiro.batch_handler
def handle(batch: Batch) -> list[Verdict]:
    return [enrollment.handle(msg) for msg in batch]
