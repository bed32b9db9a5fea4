import sys
import types

import pytest

import carteiro
from carteiro import Message, Verdict, rules


def test_kv_key_rules() -> None:
    assert rules.kv_key_problem("a", 4) is None
    assert rules.kv_key_problem("abcd", 4) is None
    assert "empty" in (rules.kv_key_problem("", 4) or "")
    assert "5 bytes; at most 4" in (rules.kv_key_problem("abcde", 4) or "")
    assert "NUL" in (rules.kv_key_problem("a\0b", 4) or "")
    assert rules.kv_key_problem("matricula/42") is None


def test_event_rules() -> None:
    long = "x" * (rules.MAX_SHORT_STRING + 1)
    assert rules.event_problem("ex", "rk", [("h", "v")]) is None
    assert rules.event_problem("", "", []) is None
    assert (rules.event_problem(long, "rk") or "").startswith("exchange is 256 bytes")
    assert (rules.event_problem("ex", "r\0k") or "").startswith("routing key")
    assert "1-255" in (rules.event_problem("ex", "rk", [("", "v")]) or "")
    assert "`h`" in (rules.event_problem("ex", "rk", [("h", "v\0")]) or "")


def test_decorator_returns_the_function_and_checks_the_signature() -> None:
    def handle(msg: Message) -> Verdict:
        return Verdict.ack()

    assert carteiro.handler(handle) is handle
    with pytest.raises(TypeError, match="exactly one argument"):

        @carteiro.handler
        def two(msg: Message, extra: int) -> Verdict:
            return Verdict.ack()

    with pytest.raises(TypeError, match="is async"):

        @carteiro.handler
        async def later(msg: Message) -> Verdict:
            return Verdict.ack()

    with pytest.raises(TypeError, match="needs a function"):
        carteiro.handler(42)  # type: ignore[type-var]


def test_sdk_imports_without_the_generated_bindings() -> None:
    assert "_carteiro_wit" not in sys.modules
    assert sys.platform != "wasi"


def test_trap_summary_names_the_exception_and_the_last_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # _component needs the generated bindings; a stand-in is enough to test the formatting.
    fake = types.ModuleType("_carteiro_wit")
    imports = types.ModuleType("_carteiro_wit.imports")
    imports.types = types.ModuleType("_carteiro_wit.imports.types")  # type: ignore[attr-defined]
    fake.imports = imports  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_carteiro_wit", fake)
    monkeypatch.setitem(sys.modules, "_carteiro_wit.imports", imports)
    monkeypatch.setitem(sys.modules, "_carteiro_wit.imports.types", imports.types)  # type: ignore[attr-defined]
    monkeypatch.delitem(sys.modules, "carteiro._component", raising=False)
    from carteiro import _component

    def inner() -> None:
        raise KeyError("curso_id\nsecond line")

    def outer() -> None:
        inner()

    try:
        outer()
    except KeyError as exc:
        where, what, end = _component.trap_summary(exc).split("\n")
    assert where.startswith("python handler panicked at ")
    assert "in inner < " in where and "in outer < " in where and where.endswith(":")
    assert what == "KeyError: 'curso_id\\nsecond line'"
    assert end == ""
    monkeypatch.delitem(sys.modules, "carteiro._component")
