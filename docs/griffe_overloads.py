"""Griffe extension: the types that the ``.pyi`` overloads know, in the API reference.

The collectives' implementations are annotated ``Any`` (one body takes
tensors, lists of tensors and numbers); their stubs beside them hold one
overload per case. The reference shows those overloads with the stubs'
private shorthands (``_G``, ``_No``, ``_TensorT``) spelled out, and gives the
implementation the union of the overloads' parameter and return types, so that
neither its signature nor the Parameters and Returns tables say ``Any`` where
the stub knows better.
"""

from __future__ import annotations

import re

from griffe import Extension, Function, Module, Object

_PRIVATE = re.compile(r"\b_[A-Za-z]\w*\b")
_TYPEVAR = re.compile(r"^TypeVar\(\s*['\"]\w+['\"]\s*,\s*(.*)\)$", re.S)
_LONG = 80  # a shorthand longer than this once spelled out (the 30 spellings of an op name) keeps its name


def _spelled(value: str) -> str:
    """An alias's value as a reader wants it: a TypeVar as its bound or constraints."""
    typevar = _TYPEVAR.match(value)
    if not typevar:
        return value
    args = typevar.group(1)
    bound = re.match(r"^bound\s*=\s*(.+)$", args.strip())
    return bound.group(1) if bound else " | ".join(a.strip() for a in args.split(","))


def _shorthands(module: Module) -> dict[str, str]:
    """The private names of a stub (and the stubs it imports them from) that have a short value."""
    names = {}
    for name, member in module.members.items():
        if not name.startswith("_"):
            continue
        try:
            value = member.value
        except Exception:  # noqa: BLE001 - an alias griffe cannot resolve keeps its name
            continue
        spelled = None if value is None else _spelled(str(value))
        if spelled is not None and len(spelled) <= _LONG:
            names[name] = spelled
    return names


def _expand(annotation, names: dict[str, str]) -> str | None:
    if annotation is None:
        return None
    text = str(annotation)
    for _ in range(3):  # shorthands defined through shorthands
        text = _PRIVATE.sub(lambda m: names.get(m.group(0), m.group(0)), text)
    return text


def _top_level(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i].strip())
            start = i + len(sep)
    return [*parts, text[start:].strip()]


def _members(text: str) -> list[str]:
    """The types a union annotation names, nested ``Union[...]``, ``Optional[...]`` and ``|`` flattened."""
    out = []
    for part in _top_level(text, "|"):
        union = re.match(r"^(?:typing\.)?(Union|Optional)\[(.*)\]$", part, re.S)
        if union:
            out.extend(member for inner in _top_level(union.group(2), ",") for member in _members(inner))
            if union.group(1) == "Optional":
                out.append("None")
        else:
            out.append(part)
    return out


def _union(texts: list) -> str:
    """The types of ``texts``, each once; ``Any`` (a case the stub leaves open) last."""
    parts = []
    for text in texts:
        for part in _members(str(text)):
            if part not in parts:
                parts.append(part)
    return " | ".join(sorted(parts, key=lambda part: part == "Any"))


def _functions(obj: Object):
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, Function):
            yield member
        elif member.is_module or member.is_class:
            yield from _functions(member)


class StubOverloads(Extension):
    def on_package(self, *, pkg: Module, **kwargs) -> None:
        for func in _functions(pkg):
            if not func.overloads:
                continue
            names = _shorthands(func.module)
            for overload in func.overloads:
                for parameter in overload.parameters:
                    parameter.annotation = _expand(parameter.annotation, names)
                overload.returns = _expand(overload.returns, names)
            if str(func.returns) == "Any":
                func.returns = _union([o.returns for o in func.overloads if o.returns])
            for parameter in func.parameters:  # the Parameters table's types too
                if str(parameter.annotation) == "Any":
                    known = [o.parameters[parameter.name].annotation for o in func.overloads
                             if parameter.name in o.parameters and o.parameters[parameter.name].annotation]
                    parameter.annotation = _union(known) if known else parameter.annotation
