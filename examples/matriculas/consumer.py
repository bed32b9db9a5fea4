"""The story's aio-pika service: it grants course access for each confirmed enrollment.

It declares its queue as the story does: ``matriculas.processar`` dead-letters through
``matriculas.dlx`` (routing key ``matriculas.falhas``) into ``matriculas.dlq``, and
``processar_matricula`` nacks a malformed event without requeue. Carteiro archives that DLQ
(``[[dead_letter_queues]]`` in config/carteiro.toml) without a line of this file changing.

    python consumer.py AMQP_URL GRANTS_FILE [--fixed]

``--fixed`` is the fix deployed after the incident: an event without ``curso_id`` grants the
enrollment's pending course instead of failing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import aio_pika

logging.basicConfig(level=logging.INFO, format="consumer: %(message)s")
logger = logging.getLogger("matriculas")


async def declarar_fila_com_dlq(channel: aio_pika.abc.AbstractChannel) -> aio_pika.abc.AbstractQueue:
    dlx = await channel.declare_exchange("matriculas.dlx", aio_pika.ExchangeType.DIRECT, durable=True)
    dlq = await channel.declare_queue("matriculas.dlq", durable=True)
    await dlq.bind(dlx, routing_key="matriculas.falhas")
    fila = await channel.declare_queue(
        "matriculas.processar",
        durable=True,
        arguments={"x-dead-letter-exchange": "matriculas.dlx", "x-dead-letter-routing-key": "matriculas.falhas"},
    )
    eventos = await channel.declare_exchange("matriculas", aio_pika.ExchangeType.TOPIC, durable=True)
    await fila.bind(eventos, routing_key="matricula.confirmada")
    return fila


def main() -> None:
    amqp_url, grants = sys.argv[1], sys.argv[2]
    fixed = "--fixed" in sys.argv[3:]

    async def processar_matricula(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        try:
            evento = json.loads(message.body)
            curso = evento["curso_id"] if not fixed else evento.get("curso_id", "curso-pendente")
            with open(grants, "a", encoding="utf-8") as f:
                f.write(f"{message.message_id} {evento['matricula_id']} {curso}\n")
            logger.info("access granted: %s to %s (event %s)", evento["usuario_id"], curso, message.message_id)
            await message.ack()
        except (KeyError, json.JSONDecodeError) as e:
            logger.error("malformed event %s (missing %s): to the DLQ", message.message_id, e)
            await message.nack(requeue=False)

    async def run() -> None:
        connection = await aio_pika.connect_robust(amqp_url)
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=16)
            fila = await declarar_fila_com_dlq(channel)
            await fila.consume(processar_matricula)
            logger.info("consuming matriculas.processar%s", " (fixed)" if fixed else "")
            await asyncio.Future()

    asyncio.run(run())


if __name__ == "__main__":
    main()
