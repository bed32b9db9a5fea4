"""Peer (b): the same enrollment as a Celery task, configured the way the Celery docs advise
for at-least-once work: `acks_late` (ack after the task returns), `autoretry_for` the
transient error with `max_retries`, no result backend. Failures that end a task -- poison,
or the transient error once the retries are spent (Celery then re-raises it; an explicit
`self.retry()` would raise MaxRetriesExceededError, handled the same) -- go to a manual
error table in `on_failure`, Celery's hook for it. The outbox is relayed by relay.py in a
process of its own.

Environment: PEERS_AMQP_URL, PEERS_DB_URL (sync SQLAlchemy URL), PEERS_QUEUE,
PEERS_EVENTS_EXCHANGE. Worker: `celery -A celery_app worker -Q $PEERS_QUEUE ...`.
"""

import os

from celery import Celery, Task
from celery.exceptions import MaxRetriesExceededError
from celery.signals import worker_process_init
from sqlalchemy import create_engine

from business import (MAX_ATTEMPTS, RETRY_DELAY_S, TransientError, call_dependency, failed,
                      now_ms, parse, record_sync)

app = Celery("peers", broker=os.environ["PEERS_AMQP_URL"])
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    result_backend=None,
    task_default_queue=os.environ["PEERS_QUEUE"],
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_engine = None


def engine():
    """One engine per worker process, made after the fork (a pool must not cross it)."""
    global _engine
    if _engine is None:
        url = os.environ["PEERS_DB_URL"]
        args = {"timeout": 30} if url.startswith("sqlite") else {}
        _engine = create_engine(url, pool_size=1, connect_args=args)
    return _engine


@worker_process_init.connect
def _fresh_engine(**_):
    global _engine
    _engine = None


class EnrollmentTask(Task):
    autoretry_for = (TransientError,)
    max_retries = MAX_ATTEMPTS - 1  # attempts = 1 + retries, as the other systems count
    default_retry_delay = RETRY_DELAY_S
    retry_backoff = False
    acks_late = True

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        exhausted = isinstance(exc, (TransientError, MaxRetriesExceededError))
        reason = f"retries exhausted: {exc}" if exhausted else str(exc)
        with engine().begin() as conn:
            conn.execute(failed.insert().values(message_id=task_id, reason=reason,
                                                attempts=self.request.retries + 1,
                                                failed_at_ms=now_ms()))


@app.task(base=EnrollmentTask, bind=True, name="peers.enroll")
def enroll(self, body):
    ids, fail_until = parse(body)
    call_dependency(fail_until, self.request.retries + 1)
    with engine().begin() as conn:
        record_sync(conn, self.request.id, ids, os.environ["PEERS_EVENTS_EXCHANGE"])
