"""The story's aio-pika service, as its article writes it: `matriculas.processar` declared with
`x-dead-letter-exchange = matriculas.dlx` (routing key `matriculas.falhas`) into
`matriculas.dlq`, and `processar_matricula`, which nacks a malformed event without requeue.

Environment: AMQP_URL, PREFIX (queue and exchange names start with it: `matriculas`),
QUEUE_TYPE (`classic` or `quorum`), PROCESSED (a file: one line per event processed),
FIXED (`1`: the fixed version, which also reads the event's old field name).
"""

import asyncio
import json
import logging
import os

import aio_pika

logger = logging.getLogger("matriculas")
PREFIX = os.environ.get("PREFIX", "matriculas")
FIXED = os.environ.get("FIXED") == "1"


async def declarar_fila_com_dlq(channel: aio_pika.abc.AbstractChannel) -> aio_pika.abc.AbstractQueue:
    quorum = {"x-queue-type": "quorum"} if os.environ.get("QUEUE_TYPE") == "quorum" else {}
    dlx = await channel.declare_exchange(f"{PREFIX}.dlx", aio_pika.ExchangeType.DIRECT, durable=True)
    dlq = await channel.declare_queue(f"{PREFIX}.dlq", durable=True, arguments=quorum)
    await dlq.bind(dlx, routing_key=f"{PREFIX}.falhas")
    return await channel.declare_queue(
        f"{PREFIX}.processar",
        durable=True,
        arguments={
            "x-dead-letter-exchange": f"{PREFIX}.dlx",
            "x-dead-letter-routing-key": f"{PREFIX}.falhas",
            **quorum,
        },
    )


def liberar_acesso_ao_curso(matricula_id: int, message_id: str) -> None:
    with open(os.environ["PROCESSED"], "a") as f:
        f.write(f"{message_id} {matricula_id}\n")


async def processar_matricula(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    try:
        evento = json.loads(message.body)
        if FIXED and "matricula_id" not in evento:
            evento["matricula_id"] = evento["matricula"]  # the fix: the old field name too
        liberar_acesso_ao_curso(evento["matricula_id"], message.message_id or "-")
        await message.ack()
    except (KeyError, json.JSONDecodeError):
        # A malformed payload: retrying will not help, it goes to the DLQ.
        logger.error("Payload inválido, mensagem vai para a DLQ: %s", message.body)
        await message.nack(requeue=False)


async def main() -> None:
    connection = await aio_pika.connect_robust(os.environ["AMQP_URL"])
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=16)
        fila = await declarar_fila_com_dlq(channel)
        await fila.consume(processar_matricula)
        print("consuming", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
