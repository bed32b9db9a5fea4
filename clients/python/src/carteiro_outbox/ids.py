"""Event ids: UUIDv7 strings (RFC 9562), made once when the row is added."""

from __future__ import annotations

import os
import time
import uuid


def new_event_id() -> str:
    """A new UUIDv7 as its 36-character string, e.g. ``0190f5c6-7a1b-7c3d-9e4f-...``.

    Version 7 puts the Unix time in milliseconds in the first 48 bits and 74 random bits
    after it: ids made later sort later (to the millisecond), so the unique index on the
    event id grows at its end like the id column's, and the id says when it was made.
    """
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)  # 62 bits
    value = (millis & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))
