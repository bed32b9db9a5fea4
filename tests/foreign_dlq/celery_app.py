"""The story's Celery side: `liberar_acesso_curso`, which fails with `IntegrityError` until the
fix (the file FIXED_FLAG exists), with the dead-letter snippet loaded.

Environment: AMQP_URL, PROCESSED (one line per task run to completion), FIXED_FLAG.
Worker: `celery -A celery_app worker -Q cursos -P solo`.
"""

import os
from pathlib import Path

from celery import Celery

import celery_dead_letters  # noqa: F401  (connects the failure handler)

app = Celery("cursos", broker=os.environ["AMQP_URL"])
app.conf.update(
    task_default_queue="cursos",
    task_acks_late=True,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


class IntegrityError(Exception):
    """Stands for SQLAlchemy's, which the story's 340 tasks failed with."""


@app.task(name="liberar_acesso_curso", max_retries=2)
def liberar_acesso_curso(matricula_id, evento_id):
    if not Path(os.environ["FIXED_FLAG"]).exists():
        raise IntegrityError(f"duplicate key value violates unique constraint (matricula {matricula_id})")
    with open(os.environ["PROCESSED"], "a") as f:
        f.write(f"{matricula_id} {evento_id}\n")
