"""Peer (d), the broker's ceiling: an aio-pika consumer that acks every delivery and does
nothing else. (host/benches/pipeline.rs has the same baseline in Rust with lapin; this one
runs in the peers' language and process model; bench/peers/lapin-baseline is the box's
limit for the enrollment route's work on the wire.) Writes DONE_FILE once EXPECT deliveries
are acked, then keeps running until terminated, so its CPU and RSS can be read.

    python baseline.py AMQP_URL QUEUE PREFETCH EXPECT DONE_FILE
"""

import asyncio
import json
import os
import sys

import aio_pika

from business import now_ms


async def main(amqp_url, queue_name, prefetch, expect, done_file):
    connection = await aio_pika.connect_robust(amqp_url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=prefetch)
    queue = await channel.get_queue(queue_name, ensure=True)
    acked, first = 0, None
    finished = asyncio.Event()

    async def on_message(message):
        nonlocal acked, first
        await message.ack()
        if first is None:
            first = now_ms()
        acked += 1
        if acked == expect:
            with open(f"{done_file}.tmp", "w") as f:
                json.dump({"first_ms": first, "last_ms": now_ms()}, f)
            os.replace(f"{done_file}.tmp", done_file)  # the driver never reads half a file
            finished.set()

    await queue.consume(on_message)
    await finished.wait()
    await asyncio.Event().wait()  # until SIGTERM


if __name__ == "__main__":
    url, q, pf, n, out = sys.argv[1:6]
    asyncio.run(main(url, q, int(pf), int(n), out))
