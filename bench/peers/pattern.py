"""Peer (a): the pattern teams write by hand instead of Carteiro. An aio-pika consumer with
explicit acks; per message one SQLAlchemy transaction holding the idempotency row, the
business row and three outbox rows; a polling publisher (relay.py) in the same process.

Retry and dead-letter semantics are Carteiro's: a transient failure republishes a copy with
`x-attempt` + 1 to a delay queue (TTL, dead-lettering back to the work queue), awaits its
confirm, then acks; poison, or a transient failure on the last attempt, is
nack(requeue=False) to the work queue's dead-letter exchange (`Q.dlx` -> `Q.dlq`). A
database error nacks with requeue: nothing is acked before its commit.

On SQLite (aiosqlite) one asyncio.Lock serialises transactions (SQLite has one writer and
aiosqlite would otherwise fail with "database is locked"); on PostgreSQL (asyncpg) the
transactions run concurrently up to the prefetch, over a pool.

    python pattern.py AMQP_URL DB_URL QUEUE EVENTS_EXCHANGE PREFETCH
"""

import asyncio
import contextlib
import sys

import aio_pika

from business import (MAX_ATTEMPTS, async_engine, RETRY_DELAY_S, PoisonError, TransientError, call_dependency,
                      parse, record_async)
from relay import relay_forever


async def declare(channel, queue):
    """The same topology Carteiro declares for a route (plus one delay queue)."""
    dlx = await channel.declare_exchange(f"{queue}.dlx", aio_pika.ExchangeType.FANOUT,
                                         durable=True)
    dlq = await channel.declare_queue(f"{queue}.dlq", durable=True)
    await dlq.bind(dlx, "")
    await channel.declare_queue(f"{queue}.retry", durable=True, arguments={
        "x-message-ttl": int(RETRY_DELAY_S * 1000),
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue})
    return await channel.declare_queue(queue, durable=True,
                                       arguments={"x-dead-letter-exchange": f"{queue}.dlx"})


async def main(amqp_url, db_url, queue_name, events_exchange, prefetch):
    postgres = db_url.startswith("postgresql")
    engine = async_engine(db_url, 8 if postgres else 1)
    lock = contextlib.nullcontext() if postgres else asyncio.Lock()

    connection = await aio_pika.connect_robust(amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.set_qos(prefetch_count=prefetch)
    queue = await declare(channel, queue_name)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage):
        attempt = int((message.headers or {}).get("x-attempt", 1))
        try:
            ids, fail_until = parse(message.body)
            call_dependency(fail_until, attempt)
            async with lock:
                async with engine.begin() as conn:
                    await record_async(conn, message.message_id, ids, events_exchange)
        except PoisonError:
            await message.nack(requeue=False)
        except TransientError:
            if attempt >= MAX_ATTEMPTS:
                await message.nack(requeue=False)
                return
            copy = aio_pika.Message(message.body, message_id=message.message_id,
                                    content_type=message.content_type,
                                    headers={**(message.headers or {}), "x-attempt": attempt + 1},
                                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(copy, routing_key=f"{queue_name}.retry")
            await message.ack()  # after the copy's confirm: publish() awaited it
        except Exception:
            # The store failed: not committed, so not acked; the broker redelivers.
            await asyncio.sleep(0.5)
            await message.nack(requeue=True)
        else:
            await message.ack()

    await queue.consume(on_message)
    print("pattern: consuming", queue_name, flush=True)
    async with connection:
        await relay_forever(engine, connection, lock if not postgres else None)


if __name__ == "__main__":
    url, db, q, ex, pf = sys.argv[1:6]
    asyncio.run(main(url, db, q, ex, int(pf)))
