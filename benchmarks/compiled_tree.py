"""A copy of a source tree with its hot path compiled as the wheel compiles it
(``hatch_build.py``, the modules ``pyproject.toml`` lists), for the benchmarks that
take a tree (``front_cpu.py --before-src``, ``http_serving.py --before-src``):
pure Python against compiled, or one commit against another, both compiled.

Run: ``python benchmarks/compiled_tree.py SRC DEST`` (SRC: a checkout's ``src/``;
DEST/src is made, with each compiled module's extension beside its ``.py``). It
needs mypy (mypyc), setuptools and a C compiler.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hatch_build import ROOT, compile_modules


def compiled_modules() -> list[str]:
    """The modules the wheel compiles (paths under ``src/``)."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    hooks = settings["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]
    return list(hooks["custom"]["compiled"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="a checkout's src/")
    parser.add_argument("dest", type=Path, help="DEST/src is made")
    args = parser.parse_args()
    tree = args.dest / "src"
    shutil.rmtree(args.dest, ignore_errors=True)
    shutil.copytree(args.src, tree, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    with tempfile.TemporaryDirectory(prefix="microbatch-mypyc-") as work:
        built = compile_modules(tree.parent, compiled_modules(), Path(work))
        for extension, inside in built.items():
            shutil.copy2(extension, tree / inside)
    print(f"{len(built)} extensions built into {tree}")


if __name__ == "__main__":
    main()
