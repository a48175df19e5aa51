"""The wheel's build hook: the request's hot path compiled to C with mypyc.

A served request runs through the connection layer, the predict route, the batcher
and its queue in the serving process's one thread; that Python is what bounds
requests per second for small requests (``benchmarks/results/http_front.md``).
mypyc compiles those modules, type-annotated as they are, to C extensions; the
``.py`` files stay in the wheel beside them, and Python imports the extension.

Only a regular wheel is compiled: an editable install (``pip install -e``) stays
pure Python, so that an edit takes effect at once. ``MICROBATCH_PURE=1`` builds a
pure wheel too. Where mypyc or a C compiler is missing, or the compilation fails,
the wheel is built pure, with a warning: the same code, slower.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ROOT = Path(__file__).resolve().parent
"""The project's root (where ``pyproject.toml`` is)."""

# What mypy is told while compiling: the package's own checks run in its tests
# (tests/test_quality.py); here third-party packages may be absent (an isolated
# build has only the build requirements), so their types are taken as Any.
_MYPY_CONFIG = """[mypy]
python_version = {version}
ignore_missing_imports = True
follow_imports = silent
"""


class CompiledHotPath(BuildHookInterface):  # type: ignore[type-arg]
    """Adds the mypyc-compiled modules named in the hook's ``compiled`` list."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile, and have the wheel carry the extensions (see the module)."""
        if version == "editable" or os.environ.get("MICROBATCH_PURE") == "1":
            return
        modules = list(self.config.get("compiled", []))
        if not modules:
            return
        self._work = Path(tempfile.mkdtemp(prefix="microbatch-mypyc-"))
        try:
            built = compile_modules(Path(self.root), modules, self._work)
        except Exception as error:  # no compiler, no mypyc, or it failed: pure
            print(f"microbatch: building pure Python (mypyc: {error})", file=sys.stderr)
            return
        for source, inside in built.items():
            build_data["force_include"][str(source)] = inside
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the compiler's files (the wheel holds what it needs)."""
        work = getattr(self, "_work", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def compile_modules(root: Path, modules: list[str], work: Path) -> dict[Path, str]:
    """Build ``modules`` (paths under ``src/``) in ``work``; return each extension
    file and its path inside the wheel."""
    from mypyc.build import mypycify
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    config = work / "mypy.ini"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    config.write_text(_MYPY_CONFIG.format(version=version))
    here = os.getcwd()
    os.chdir(root / "src")  # module names come from the paths below it
    try:
        extensions = mypycify(
            ["--config-file", str(config), *modules],
            opt_level="3",
            target_dir=str(work / "c"),
        )
        command = build_ext(Distribution({"name": "microbatch", "ext_modules": extensions}))
        command.build_lib = str(work / "lib")
        command.build_temp = str(work / "temp")
        command.ensure_finalized()
        command.run()
    finally:
        os.chdir(here)
    lib = work / "lib"
    return {path: path.relative_to(lib).as_posix() for path in lib.rglob("*.so")}
