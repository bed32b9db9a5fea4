"""The polling publisher of the hand-written pattern: every POLL_S, take up to BATCH unpublished
outbox rows in id order, publish them (persistent, mandatory, event id as message_id) with
publisher confirms, and mark exactly the confirmed rows published. A nack or a returned
message leaves its row pending for the next poll (at least once, like Carteiro's relay).

Runs inside pattern.py, or alone beside a Celery worker: `python relay.py AMQP_URL DB_URL`.
"""

import asyncio
import contextlib
import sys

import aio_pika
from sqlalchemy import select, update

from business import async_engine, now_ms, outbox

POLL_S = 0.1
BATCH = 500


async def relay_forever(engine, connection, lock=None):
    """`lock` serialises database access with the consumer on SQLite (one writer)."""
    channel = await connection.channel(publisher_confirms=True)
    lock = lock or contextlib.nullcontext()
    while True:
        async with lock:
            async with engine.connect() as conn:
                rows = (await conn.execute(
                    select(outbox).where(outbox.c.published_at_ms.is_(None))
                    .order_by(outbox.c.id).limit(BATCH))).all()
        if not rows:
            await asyncio.sleep(POLL_S)
            continue
        exchanges = {}
        for name in {r.exchange for r in rows}:
            exchanges[name] = await channel.get_exchange(name, ensure=False)
        results = await asyncio.gather(*(
            exchanges[r.exchange].publish(
                aio_pika.Message(r.payload.encode(), message_id=r.event_id,
                                 content_type="application/json",
                                 headers={"x-causation-id": r.causation_id},
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=r.routing_key, mandatory=True)
            for r in rows), return_exceptions=True)
        confirmed = [r.id for r, res in zip(rows, results) if not isinstance(res, BaseException)]
        if confirmed:
            async with lock:
                async with engine.begin() as conn:
                    await conn.execute(update(outbox).where(outbox.c.id.in_(confirmed))
                                       .values(published_at_ms=now_ms()))
        if len(rows) < BATCH:
            await asyncio.sleep(POLL_S)


async def main(amqp_url, db_url):
    engine = async_engine(db_url, 2)
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await relay_forever(engine, connection)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
