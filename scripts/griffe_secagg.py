"""A griffe extension for the API reference (mkdocs.yml, docs/reference/api.md), which
mkdocstrings renders from the source as griffe reads it:

- the names ``secagg`` loads on first use (``secagg._LAZY``: ``secagg.run``,
  ``secagg.ExperimentConfig``, ...) are aliases of what they load, as the module's
  ``__getattr__`` makes them at run time, so that the page names them as a user does;
- the docstrings' Sphinx roles (:class:`~secagg.protocols.base.Protocol`, :meth:`batch`,
  ...) read as plain code, the name as Sphinx would show it (``~`` keeps the last part).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|data|attr|mod|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every role written as its name in code."""
    return ROLE.sub(lambda m: f"``{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}``", text)


def lazy_names(init: Path) -> dict[str, str]:
    """secagg's lazily loaded names, name -> the module that defines it: ``_LAZY`` as
    ``init`` (the package's ``__init__.py``, the one griffe reads) spells it."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets
        ):
            return dict(ast.literal_eval(node.value))
    raise LookupError(f"{init} has no _LAZY")


class SecaggAPI(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "secagg":
            return
        assert isinstance(pkg.filepath, Path)
        for name, module in lazy_names(pkg.filepath).items():
            if name not in pkg.members:
                pkg.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=pkg))

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
