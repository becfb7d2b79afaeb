"""Griffe extension: Sphinx markup in docstrings as Markdown.

polydist's docstrings name other objects the Sphinx way (:func:`all_reduce`,
:class:`~polydist.Work`) and introduce literal blocks with a trailing ``::``;
mkdocstrings renders Markdown, where those would show their markup. ``~``
keeps only the last name, and ``text::`` becomes ``text:``, as in Sphinx (the
indented block below is code in Markdown too).
"""

from __future__ import annotations

import re

from griffe import Extension

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|py:\w+):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", re.M)  # a paragraph that ends in "::" introduces a literal block


def _code(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _LITERAL.sub(":", _ROLE.sub(_code, obj.docstring.value))
