"""Griffe extension: one readable signature per function in the API reference, its overloads as a table.

The collectives' implementations are annotated ``Any`` (one body takes
tensors, lists of tensors and numbers); their stubs beside them hold one
overload per case. The reference shows the implementation's signature only,
typed with the union of the overloads' types, and the overloads as a table of
accepted and returned types put before the docstring's Args section. Every
signature spells types the modern way (``X | None``, not ``Optional[X]``) and
without private names: the stubs' shorthands (``_G``, ``_No``, ``_TensorT``)
become their values, a private context-manager class (``_Restore``) becomes
``AbstractContextManager[None]``, and ``Any`` is dropped from a union of known types.
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
    """The types of ``texts``, each once; ``Any`` (a case the stub leaves open) only when nothing else is known."""
    parts = []
    for text in texts:
        for part in _members(str(text)):
            if part not in parts:
                parts.append(part)
    return _known(" | ".join(parts))


def _functions(obj: Object):
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, Function):
            yield member
        elif member.is_module or member.is_class:
            yield from _functions(member)


def _modern(text: str) -> str:
    """``Union[A, B]`` as ``A | B``, ``Optional[A]`` as ``A | None`` (also nested), forward-reference quotes dropped."""
    text = re.sub(r"""["']([\w.]+)["']""", r"\1", text)
    while True:
        match = re.search(r"\b(?:typing\.)?(Union|Optional)\[", text)
        if not match:
            return text
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += (text[end] == "[") - (text[end] == "]")
            if depth == 0:
                break
        inner = " | ".join(_modern(part) for part in _top_level(text[match.end():end], ","))
        text = text[:match.start()] + inner + (" | None" if match.group(1) == "Optional" else "") + text[end + 1:]


def _known(text: str) -> str:
    """A union without ``Any`` where it names other types (``Any`` is then a case the stub leaves open)."""
    parts = _top_level(text, "|")
    known = [part for part in parts if part != "Any"]
    return " | ".join(known) if known and len(known) < len(parts) else text


def _private_classes(module: Module) -> dict[str, str]:
    """Private classes of ``module`` that are context managers, as the public type they behave as."""
    return {name: "AbstractContextManager[None]" for name, member in module.members.items()
            if name.startswith("_") and not member.is_alias and member.is_class and "__enter__" in member.members}


def _literal_names(value: str) -> str | None:
    """A long ``Literal`` of op names as the names it accepts, once each and upper-case: ``SUM, MIN, ...``."""
    if not value.startswith("Literal["):
        return None
    names = list(dict.fromkeys(v.upper() for v in re.findall(r"""["'](\w+)["']""", value)))
    return "one of " + ", ".join(names) + " (any case)" if names else None


def _clean(annotation, names: dict[str, str]) -> str | None:
    text = _expand(annotation, names)
    return None if text is None else _known(_modern(text))


def _cell(text: str | None) -> str:
    if text is None:
        return ""
    literal = re.fullmatch(r"Literal\[(.*)\]", text)
    return literal.group(1) if literal else f"`{text}`"


def _table(func: Function, names: dict[str, str], long_names: dict[str, str]) -> str:
    """The overloads as Markdown: one row each, a column per parameter whose type differs between them."""
    varying = [p.name for p in func.parameters
               if len({str(o.parameters[p.name].annotation) if p.name in o.parameters else None
                       for o in func.overloads}) > 1]
    header = "| " + " | ".join(f"`{name}`" for name in varying) + " | returns |"
    rows = [header, "|" + "---|" * (len(varying) + 1)]
    narrowed: dict = {}  # (column, the row's other cells) -> a narrower value an earlier row took in that column
    for overload in func.overloads:
        raw = {p.name: str(p.annotation) for p in overload.parameters}
        cells = []
        for name in varying:
            value = raw.get(name)
            cells.append(long_names.get(value) or _cell(_clean(value, names)) if value else "")
        for i, name in enumerate(varying):
            others = tuple(c for j, c in enumerate(cells) if j != i)
            if raw.get(name) in long_names:
                narrowed[(i, others)] = True
            elif narrowed.get((i, others)):  # a row after a narrower one of the same types takes the rest
                cells[i] = f"any other ({cells[i]})"
        same = next((n for n, a in raw.items() if a == str(overload.returns) and a.startswith("_") and a in names), None)
        returns = f"the type of `{same}`" if same else _cell(_clean(overload.returns, names))
        if returns == "`Any`" and "async_op" in varying and raw.get("async_op") == "bool":
            returns = "as the rows above: `Work` when `async_op` is true"  # a bool known only when run
        cells.append(returns)
        rows.append("| " + " | ".join(cells) + " |")
    return "Accepted and returned types:\n\n" + "\n".join(rows) + "\n\n"


def _with_table(docstring: str, table: str) -> str:
    """``table`` before the docstring's first section (Args, Returns, ...), else at its end."""
    section = re.search(r"^(?:Args|Arguments|Parameters|Returns|Raises|Example|Examples|Note):\s*$", docstring, re.M)
    at = section.start() if section else len(docstring)
    return docstring[:at].rstrip() + "\n\n" + table + docstring[at:]


class StubOverloads(Extension):
    def on_package(self, *, pkg: Module, **kwargs) -> None:
        for func in _functions(pkg):
            names = {**_shorthands(func.module), **_private_classes(func.module)}
            if func.overloads:
                long_names = {}
                for name, member in func.overloads[0].module.members.items():  # the stub's long op Literal
                    try:
                        spelled = _literal_names(str(member.value)) if name.startswith("_") else None
                    except Exception:  # noqa: BLE001 - not an alias with a value
                        spelled = None
                    if spelled:
                        long_names[name] = spelled
                if func.docstring is not None:
                    func.docstring.value = _with_table(func.docstring.value, _table(func, names, long_names))
                if str(func.returns) == "Any":
                    func.returns = _union([_clean(o.returns, names) for o in func.overloads if o.returns])
                for parameter in func.parameters:  # the signature's and the Parameters table's types
                    if str(parameter.annotation) == "Any":
                        known = [_clean(o.parameters[parameter.name].annotation, names) for o in func.overloads
                                 if parameter.name in o.parameters and o.parameters[parameter.name].annotation]
                        parameter.annotation = _union(known) if known else parameter.annotation
                func.overloads = []  # shown as the table
            for parameter in func.parameters:
                parameter.annotation = _clean(parameter.annotation, names)
            func.returns = _clean(func.returns, names)
