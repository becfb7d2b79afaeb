"""Griffe extension: Sphinx cross-reference roles in docstrings as Markdown code.

polydist's docstrings name other objects the Sphinx way (:func:`all_reduce`,
:class:`~polydist.Work`); mkdocstrings renders Markdown, where those would
show their role markup. ``~`` keeps only the last name, as in Sphinx.
"""

from __future__ import annotations

import re

from griffe import Extension

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|py:\w+):`(~?)([^`]+)`")


def _code(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
