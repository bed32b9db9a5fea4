"""The story's enrollment service: a SQLAlchemy 2.0 Unit of Work that confirms an
enrollment and writes its ``outbox_events`` row in the same commit.

Carteiro relays the table (``[[outboxes]]`` in config/carteiro.toml), a route's handler
applies each event once, and nobody hand-writes the poller.

    python service.py DATABASE_URL create
    python service.py DATABASE_URL confirm ALUNO CURSO [--sem-curso]   -> prints the event id
    python service.py DATABASE_URL report EVENT_ID...                  -> one line per event
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import datetime

from sqlalchemy import String, Text, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


class Base(DeclarativeBase):
    pass


class Matricula(Base):
    __tablename__ = "matriculas"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    aluno_id: Mapped[str] = mapped_column(String(40))
    curso_id: Mapped[str | None] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(20))


# The story's outbox table, exactly as the story declares it.
class OutboxEvent(Base):
    __tablename__ = "outbox_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    evento_id: Mapped[str] = mapped_column(String(64), unique=True)
    tipo: Mapped[str] = mapped_column(String(80))  # "matricula.confirmada"
    routing_key: Mapped[str] = mapped_column(String(80))
    payload: Mapped[str] = mapped_column(Text)  # JSON as text
    criado_em: Mapped[datetime] = mapped_column(default=datetime.utcnow)
    publicado: Mapped[bool] = mapped_column(default=False)
    publicado_em: Mapped[datetime | None] = mapped_column(default=None)


def confirmar_matricula(session: Session, aluno_id: str, curso_id: str | None) -> str:
    """Confirms an enrollment and records its event, in the caller's transaction."""
    matricula = Matricula(id=f"M-{uuid.uuid4().hex[:8]}", aluno_id=aluno_id, curso_id=curso_id, status="confirmada")
    session.add(matricula)
    payload = {"matricula_id": matricula.id, "usuario_id": aluno_id}
    if curso_id is not None:
        payload["curso_id"] = curso_id
    evento_id = str(uuid.uuid4())
    session.add(
        OutboxEvent(
            evento_id=evento_id,
            tipo="matricula.confirmada",
            routing_key="matricula.confirmada",
            payload=json.dumps(payload),
        )
    )
    return evento_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("create")
    confirm = sub.add_parser("confirm")
    confirm.add_argument("aluno")
    confirm.add_argument("curso")
    confirm.add_argument("--sem-curso", action="store_true", help="the bug: the event leaves curso_id out")
    report = sub.add_parser("report")
    report.add_argument("events", nargs="+")
    args = parser.parse_args()
    engine = create_engine(args.url)
    if args.command == "create":
        Base.metadata.create_all(engine)
    elif args.command == "confirm":
        with Session(engine) as session, session.begin():  # one Unit of Work, one commit
            print(confirmar_matricula(session, args.aluno, None if args.sem_curso else args.curso))
    else:
        with Session(engine) as session:
            for evento_id in args.events:
                row = session.scalars(select(OutboxEvent).where(OutboxEvent.evento_id == evento_id)).one()
                when = row.publicado_em.strftime("%H:%M:%S.%f")[:-3] if row.publicado_em else "-"
                state = f"published at {when}" if row.publicado else "pending"
                print(f"{evento_id}  row {row.id}: {state}")


if __name__ == "__main__":
    main()
