"""Docstrings for the public classes that the wheel compiles: mypyc keeps no class
docstring at run time (``help()`` and the API docs would show none), so they are read
back from the source file that the wheel carries beside the extension."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def restore_docstring(cls: type) -> None:
    """Give ``cls`` its source's docstring where compiling dropped it (a pure build,
    or a class that kept its docstring, is left as it is)."""
    if cls.__doc__:
        return
    module = sys.modules[cls.__module__]
    if module.__file__ is None:
        return
    source = Path(module.__file__).with_name(cls.__module__.rpartition(".")[2] + ".py")
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):  # a wheel without its sources: no docstring to give
        return
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            cls.__doc__ = ast.get_docstring(node)
            return
