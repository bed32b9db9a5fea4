"""A service on the carteiro-outbox helper: an ``OutboxMixin`` model and ``add_event`` in its
own transactions. Used by the e2e test that relays what the helper's printed block names.

    helper_model.py URL create
    helper_model.py URL write N        -> prints the event ids, one per line
"""

from __future__ import annotations

import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Session

from carteiro_outbox import OutboxMixin, add_event


class Base(DeclarativeBase):
    pass


class Evento(OutboxMixin, Base):
    __tablename__ = "eventos_helper"


def main() -> None:
    url, command = sys.argv[1], sys.argv[2]
    engine = create_engine(url)
    if command == "create":
        Base.metadata.create_all(engine)
        return
    for i in range(int(sys.argv[3])):
        with Session(engine) as session, session.begin():
            print(
                add_event(
                    session,
                    type="matricula.confirmada",
                    routing_key="matricula.confirmada",
                    payload={"n": i},
                    key=f"aluno-{i % 3}",
                    model=Evento,
                )
            )


if __name__ == "__main__":
    main()
