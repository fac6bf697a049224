"""The dependency graph of docs/INTERNALS.md is the real one: every ``import`` of our own packages, read from the
source with ``ast`` (function-local imports included), and every import made by name (``importlib.import_module``,
``__import__``, ``importlib.util.find_spec``, and any string constant naming one of our modules, as a table of
module names for one of those would), goes only along the documented edges."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> source folder, as pyproject.toml maps them ([tool.setuptools] package-dir)
PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]


def _folder(package: str) -> Path:
    """``package``'s source folder: its own package-dir entry, else its parent's folder and its last name."""
    if package in PACKAGE_DIR:
        return ROOT / PACKAGE_DIR[package]
    parent, _, leaf = package.rpartition(".")
    return _folder(parent) / leaf


PACKAGES = {
    package: _folder(package)
    for package in (
        "colitools.formats",
        "colitools.converters",
        "colitools.verify",
        "colitools.runtime",
        "colitools.mirror",
        "colitools.cli",
    )
}
# what each package may import of ours besides itself (docs/INTERNALS.md, "Dependency direction"); the
# library raises the classes of colitools.formats.errors (colitools.errors is their re-export for users)
ALLOWED = {
    "colitools.formats": set(),
    "colitools.converters": {"colitools.formats"},
    "colitools.runtime": {"colitools.formats"},
    "colitools.mirror": {"colitools.formats"},
    "colitools.verify": {
        "colitools.formats",
        "colitools.converters",
        "colitools.runtime",
    },
    "colitools.cli": set(PACKAGES) | {"colitools.errors", "colitools"},
}


IMPORTS_BY_NAME = {"import_module", "__import__", "find_spec"}  # importlib's, the builtin, importlib.util's
COMPUTED = "<a module name computed at run time>"


def _our_imports(path: Path) -> set[str]:
    return _imports_in(path.read_text(encoding="utf-8"), str(path))


def _imports_in(source: str, filename: str = "<source>") -> set[str]:
    tree = ast.parse(source, filename=filename)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and _called_name(node) in IMPORTS_BY_NAME and node.args:
            found.add(_name_imported(node.args[0]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _names_our_module(node.value):
            found.add(node.value)  # a module named in a string: an import by name somewhere
    return {m for m in found if m == COMPUTED or m == "colitools" or m.startswith("colitools.")}


def _names_our_module(text: str) -> bool:
    return re.fullmatch(r"colitools(\.[A-Za-z_]\w*)+", text) is not None and _package_of(text) is not None


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _name_imported(arg: ast.expr) -> str:
    """The module an import by name asks for: a literal, the literal head of an f-string (its package), else
    ``COMPUTED`` (nothing here can check it: a failure, so that no edge hides behind a variable)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        head = str(arg.values[0].value).rstrip(".")
        if head.startswith("colitools.") and _package_of(head):
            return head
    return COMPUTED


def _package_of(module: str) -> str | None:
    """Which of our packages ``module`` (a dotted name) is in, or None (a metadata key: "colitools.shapes")."""
    for pkg in sorted(PACKAGES, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    if module == "colitools.errors" or module.startswith("colitools.errors."):
        return "colitools.errors"
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_follow_the_documented_direction(package: str) -> None:
    bad = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        for module in sorted(_our_imports(path)):
            if module == COMPUTED:
                bad.append(f"{path.relative_to(ROOT)} imports a module by a name computed at run time")
                continue
            target = _package_of(module)
            if target is None:
                # ``import colitools`` reads the package's version string; any other top-level module
                # (``colitools.demo``, ``colitools.__main__``) is an entry point nothing may import but the CLI
                target = "colitools" if module in ("colitools", "colitools.__version__") else module
            if target == "colitools" and package != "colitools.formats":
                continue
            if target != package and target not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)


def test_formats_imports_nothing_of_ours_outside_formats() -> None:
    for path in sorted(PACKAGES["colitools.formats"].rglob("*.py")):
        outside = {m for m in _our_imports(path) if _package_of(m) != "colitools.formats"}
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_imports_made_by_name_are_seen():
    """What formats/kernels/aot.py once did (the runtime's kernel modules named in strings and imported with
    importlib) is an edge this test reads; a name it cannot read is a failure of its own."""
    old_aot = (
        "import importlib\n"
        '_RT = "colitools.runtime._jit_kernels"\n'
        "def jit(m):\n"
        "    return importlib.import_module(m)\n"
        "def other():\n"
        '    return __import__("colitools.converters.runner"), importlib.import_module(f"colitools.verify.{x}")\n'
    )
    found = _imports_in(old_aot)
    assert {
        "colitools.runtime._jit_kernels",
        "colitools.converters.runner",
        "colitools.verify",
        COMPUTED,
    } == found
    assert (
        _imports_in('KEY = "colitools.shapes"\nNAME = "colitools.json"\n') == set()
    )  # metadata, not modules
