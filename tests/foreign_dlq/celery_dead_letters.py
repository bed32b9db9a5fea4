# Carteiro's Celery snippet (docs/dead-letters.md, "Celery"): a task that fails for good is sent,
# with why it failed, to the dead-letter exchange whose queue Carteiro archives.
from celery.signals import task_failure

DEAD_LETTER_EXCHANGE = "cursos.dlx"  # a direct exchange, bound to the archived DLQ
DEAD_LETTER_ROUTING_KEY = "cursos.falhas"


@task_failure.connect
def send_to_dead_letters(sender=None, task_id=None, exception=None, args=None, kwargs=None, **_):
    delivery = sender.request.delivery_info or {}
    sender.apply_async(
        args=args,
        kwargs=kwargs,
        task_id=task_id,  # the same task id: Carteiro's replay sends this copy back as it is
        exchange=DEAD_LETTER_EXCHANGE,
        routing_key=DEAD_LETTER_ROUTING_KEY,
        headers={
            "x-exception-type": type(exception).__name__,
            "x-exception": str(exception)[:1000],
            "x-original-exchange": delivery.get("exchange") or "",
            "x-original-routing-key": delivery.get("routing_key") or "",
        },
    )
