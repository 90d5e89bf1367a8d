"""A Griffe extension for the API reference: the docstrings' Sphinx roles as cross-references.

radio-lit's docstrings name other objects the way Sphinx does (``:func:`radio_lit.load```,
``:class:`~radio_lit.students.CPEViT```, ``:meth:`fit```); mkdocstrings reads Markdown and
would print those roles as text. When mkdocstrings has loaded the package, this extension
rewrites every docstring's roles into autorefs' links (``<autoref identifier=…>``): the name
is looked up as Python would from where the docstring is (the object itself, its class, its
module and their parents, imported names followed to their definitions), and linked to its
entry in the API reference. [choice] A link is *optional* (autorefs' own mechanism for API
objects): a name the reference does not render (private, or another library's) stays code
text rather than failing ``mkdocs build --strict``. Titles follow Sphinx: ``~a.b.C`` shows
``C``, ``title <a.b.C>`` shows ``title``, a leading ``!`` never links.

[choice] The docstrings keep their Sphinx roles (``help()`` and editors show them as they
are; no rewrite of ~800 roles across radio_lit/): no package on PyPI turns Sphinx roles into
mkdocstrings' cross-references (``griffe-sphinx`` parses attribute comments, not roles), so
the API build does it here (``mkdocs.yml``: ``extensions``).
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from griffe import Alias, Extension, Module, Object

#: A Sphinx role: ``:func:`…```, ``:py:class:`…```.
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|const):`(?P<body>[^`]+)`")
#: ``title <target>``.
TITLED = re.compile(r"(?P<title>.*?)\s*<(?P<target>[^<>]+)>")


def resolve(target: str, scope: Object, collection: Any) -> str | None:
    """The full path of the object that ``target`` names in ``scope`` (its definition's, for
    an imported name), or ``None`` when no loaded object has that name."""
    candidates, here = [], scope
    while here is not None:
        candidates.append(f"{here.path}.{target}")
        here = here.parent
    candidates.append(target)
    for path in candidates:
        try:
            found = collection[path]
        except Exception:  # griffe: KeyError, or an alias on the way it cannot follow
            continue
        if isinstance(found, Alias):
            try:
                found = found.final_target
            except Exception:  # another library's object, not loaded: nothing to link to
                return None
        return found.path
    return None


def cross_reference(body: str, scope: Object, collection: Any) -> str:
    """The Markdown of one role's ``body`` in ``scope``'s docstring."""
    titled = TITLED.fullmatch(body)
    target = titled.group("target") if titled else body
    no_link = target.startswith("!")
    short = target.lstrip("!").startswith("~")
    target = target.lstrip("!~").lstrip(".")
    title = titled.group("title") if titled else target.rsplit(".", 1)[-1] if short else target
    code = f"`{title}`"
    path = None if no_link else resolve(target, scope, collection)
    if path is None:
        return code
    return f'<autoref identifier="{escape(path)}" slug="{escape(target)}" optional>{code}</autoref>'


def rewrite(text: str, scope: Object, collection: Any) -> str:
    """``text`` with each Sphinx role replaced by :func:`cross_reference`'s Markdown."""
    return ROLE.sub(lambda match: cross_reference(match["body"], scope, collection), text)


class SphinxRoles(Extension):
    """Rewrite the Sphinx roles of every docstring of a loaded package (:func:`rewrite`)."""

    def on_package(self, *, pkg: Module, loader: Any, **kwargs: Any) -> None:
        collection = loader.modules_collection
        pending: list[Object] = [pkg]
        while pending:
            obj = pending.pop()
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj, collection)
            pending += [m for m in obj.members.values() if not isinstance(m, Alias)]
