"""Finding the one mapped model of a mixin, so callers with one table need not name it."""

from __future__ import annotations


def mapped_subclasses(mixin: type) -> list[type]:
    """Every class below ``mixin`` that is mapped to a table of its own."""
    found: list[type] = []
    pending = list(mixin.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if "__table__" in vars(cls) and cls not in found:
            found.append(cls)
    return found


def only_model(mixin: type, model: type | None, caller: str) -> type:
    """``model`` if given, else the one mapped model of ``mixin``; several or none: TypeError."""
    if model is not None:
        return model
    models = mapped_subclasses(mixin)
    if len(models) != 1:
        names = ", ".join(sorted(m.__qualname__ for m in models)) or "none"
        raise TypeError(
            f"{caller}: pass model=...; {len(models)} {mixin.__name__} models are mapped ({names})"
        )
    return models[0]
