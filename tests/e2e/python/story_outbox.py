"""The story's enrollment service writing its own ``outbox_events`` table with SQLAlchemy 2.0,
exactly as the story declares it (no helper). Used by the e2e tests of ``[[outboxes]]``.

    story_outbox.py URL create
    story_outbox.py URL write N OUT.json [--threads T] [--rollback-share S] [--payload-bytes B]

``write`` commits N transactions from T threads, each holding its row (and its id) for a
random moment before it commits, so younger ids commit first; a share of them roll back.
OUT.json gets ``{"committed": [...], "rolled_back": [...]}`` (event ids).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import Session


# The story's table, exactly as the story declares it: the demo's enrollment service's model.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "matriculas"))
from service import Base, OutboxEvent  # noqa: E402


def write(engine, n: int, threads: int, rollback_share: float, payload_bytes: int) -> dict:
    committed: list[str] = []
    rolled_back: list[str] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        rnd = random.Random(w)
        for i in range(w, n, threads):
            event_id = str(uuid.uuid4())
            body = {"matricula": i, "aluno": f"aluno-{i}", "pad": "x" * payload_bytes}
            with Session(engine) as session:
                session.add(
                    OutboxEvent(
                        evento_id=event_id,
                        tipo="matricula.confirmada",
                        routing_key="matricula.confirmada",
                        payload=json.dumps(body),
                    )
                )
                session.flush()  # the row takes its id now; other threads commit meanwhile
                time.sleep(rnd.random() * 0.02)
                if rnd.random() < rollback_share:
                    session.rollback()
                    with lock:
                        rolled_back.append(event_id)
                else:
                    session.commit()
                    with lock:
                        committed.append(event_id)

    pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"committed": committed, "rolled_back": rolled_back}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("command", choices=["create", "write"])
    parser.add_argument("n", nargs="?", type=int, default=0)
    parser.add_argument("out", nargs="?")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rollback-share", type=float, default=0.2)
    parser.add_argument("--payload-bytes", type=int, default=0)
    args = parser.parse_args()
    engine = create_engine(args.url, pool_size=args.threads + 1)
    if args.command == "create":
        Base.metadata.create_all(engine)
        return
    result = write(engine, args.n, args.threads, args.rollback_share, args.payload_bytes)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
