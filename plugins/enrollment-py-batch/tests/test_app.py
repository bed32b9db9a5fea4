"""The batch handler has enrollment-py's effects, per message."""

from __future__ import annotations

from carteiro import Message, Verdict
from carteiro.testing import MockHost

import app
from enrollment import ACESSO_LIBERADO, EMAIL_SOLICITADO, FATURA_SOLICITADA


def confirmada(body: object, id: str) -> Message:
    return Message.from_json("matricula.confirmada", body, id=id)


def test_each_message_of_a_batch_is_confirmed_alone(mock_host: MockHost) -> None:
    good = {"matricula_id": "m-1", "usuario_id": 7, "curso_id": "rust-101"}
    bad = {"matricula_id": "m-2", "usuario_id": 8}
    outcomes = mock_host.run_batch(app.handle, [confirmada(good, "a"), confirmada(bad, "b")])
    assert outcomes[0].verdict == Verdict.ack()
    assert [e.routing_key for e in outcomes[0].events] == [
        ACESSO_LIBERADO,
        FATURA_SOLICITADA,
        EMAIL_SOLICITADO,
    ]
    assert outcomes[1].verdict.is_dead_letter
    assert "curso_id" in (outcomes[1].verdict.reason or "")
    assert mock_host.kv_json("matricula/m-1") == good
    assert mock_host.kv("matricula/m-2") is None
    assert len(mock_host.events()) == 3
