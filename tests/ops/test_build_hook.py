"""The wheel's build hook (``hatch_build.py``): which builds compile the hot path,
what the wheel is told about the extensions, and the pure fallback. The compilation
itself is slow (tens of seconds): ``.ci/run`` builds the real wheel and runs the
whole suite against it."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import hatch_build
import pytest
from hatch_build import ROOT, CompiledHotPath

from .test_deploy import tomllib

MODULES = ["microbatch/serve/connection.py"]


def hook(tmp_path: Path, modules: list[str] = MODULES) -> CompiledHotPath:
    return CompiledHotPath(str(ROOT), {"compiled": modules}, None, None, str(tmp_path), "wheel")


def fake_compile(built: dict[Path, str], calls: list[list[str]]) -> Any:
    def compile_modules(root: Path, modules: list[str], work: Path) -> dict[Path, str]:
        assert root == ROOT and work.is_dir()
        calls.append(modules)
        return built

    return compile_modules


def test_a_regular_wheel_carries_the_extensions_and_is_not_pure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extension = tmp_path / "connection.cpython-311-x86_64-linux-gnu.so"
    built = {extension: "microbatch/serve/connection.cpython-311-x86_64-linux-gnu.so"}
    calls: list[list[str]] = []
    monkeypatch.setattr(hatch_build, "compile_modules", fake_compile(built, calls))
    monkeypatch.delenv("MICROBATCH_PURE", raising=False)
    build_data: dict[str, Any] = {"force_include": {}, "pure_python": True, "infer_tag": False}
    compiled = hook(tmp_path)
    compiled.initialize("standard", build_data)
    assert calls == [MODULES]
    assert build_data == {
        "force_include": {str(extension): built[extension]},
        "pure_python": False,
        "infer_tag": True,  # a platform wheel: cp311-cp311-linux_x86_64
    }
    work = compiled._work
    compiled.finalize("standard", build_data, str(tmp_path / "the.whl"))
    assert not work.exists()  # the compiler's files are removed


@pytest.mark.parametrize("version, pure", [("editable", "0"), ("standard", "1")])
def test_an_editable_install_or_microbatch_pure_builds_pure_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, pure: str
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(hatch_build, "compile_modules", fake_compile({}, calls))
    monkeypatch.setenv("MICROBATCH_PURE", pure)
    build_data: dict[str, Any] = {"force_include": {}, "pure_python": True}
    hook(tmp_path).initialize(version, build_data)
    assert calls == []
    assert build_data == {"force_include": {}, "pure_python": True}


def test_a_failed_compilation_builds_pure_python_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_compiler(root: Path, modules: list[str], work: Path) -> dict[Path, str]:
        raise RuntimeError("error: command 'gcc' failed: No such file or directory")

    monkeypatch.setattr(hatch_build, "compile_modules", no_compiler)
    monkeypatch.delenv("MICROBATCH_PURE", raising=False)
    build_data: dict[str, Any] = {"force_include": {}, "pure_python": True}
    hook(tmp_path).initialize("standard", build_data)
    assert build_data == {"force_include": {}, "pure_python": True}
    said = capsys.readouterr().err
    assert "building pure Python" in said and "gcc" in said


def test_the_compiled_modules_exist_and_the_build_needs_mypyc() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    hooks = settings["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]
    modules = hooks["custom"]["compiled"]
    assert modules and all((ROOT / "src" / module).is_file() for module in modules)
    requires = settings["build-system"]["requires"]
    assert any(r.startswith("mypy") for r in requires)
    assert any(r.startswith("setuptools") for r in requires)


def test_no_interpreted_class_inherits_from_a_compiled_one_not_made_for_it() -> None:
    # mypyc refuses it at import time ("interpreted classes cannot inherit from
    # compiled"), unless the compiled class allows it: in the compiled wheel such a
    # module would not even import.
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    compiled_paths = settings["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]
    compiled = {path.removesuffix(".py").replace("/", ".") for path in compiled_paths["compiled"]}
    found = []
    for path in sorted((ROOT / "src" / "microbatch").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
        name = name.removesuffix(".__init__")
        if name in compiled or name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == name:
                found += [
                    f"{name}.{value.__name__}({base.__module__}.{base.__name__})"
                    for base in value.__mro__[1:]
                    if base.__module__ in compiled and not _allows_subclasses(base)
                ]
    assert not found, f"interpreted classes inheriting from compiled ones: {found}"


def _allows_subclasses(cls: type) -> bool:
    """Whether the class is marked ``@mypyc_attr(allow_interpreted_subclasses=True)``,
    read from its module's source (a compiled class has none to inspect)."""
    path = ROOT / "src" / (cls.__module__.replace(".", "/") + ".py")
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"class {cls.__name__}"))
    decorators = []
    for line in reversed(lines[:at]):
        if not line.startswith("@"):
            break
        decorators.append(line)
    return any("allow_interpreted_subclasses=True" in line for line in decorators)
