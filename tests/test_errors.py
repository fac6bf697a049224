"""One module of errors (``formats/errors.py``): every error class of the library is defined there, and no
``except`` re-raises an error only to give the same message another class (an error propagates as raised)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

import colitools.errors
from colitools.formats import errors

ROOT = Path(__file__).resolve().parents[1]
# the library's source folders, as pyproject.toml maps them ([tool.setuptools] package-dir)
PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
LIBRARY = sorted({ROOT / d for d in PACKAGE_DIR.values()})
ERRORS_MODULE = ROOT / PACKAGE_DIR["colitools.formats"] / "errors.py"


def _library_files() -> list[Path]:
    return sorted(p for d in LIBRARY for p in d.rglob("*.py"))


def _exception_classes(tree: ast.AST) -> list[ast.ClassDef]:
    """Classes whose bases name an exception (``...Error``, ``...Exception``, ``...Stop``, ``...Refused``)."""

    def is_exception(base: ast.expr) -> bool:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        return name.endswith(("Error", "Exception", "Stop", "Refused"))

    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and any(map(is_exception, n.bases))]


def test_every_public_error_class_is_defined_in_formats_errors():
    """Private control-flow signals (``_Cancelled``: stop the other copies) may stay where they are raised."""
    elsewhere = []
    for path in _library_files():
        if path == ERRORS_MODULE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        elsewhere += [
            f"{path.relative_to(ROOT)}: {c.name}"
            for c in _exception_classes(tree)
            if not c.name.startswith("_")
        ]
    assert not elsewhere, "\n".join(elsewhere)
    defined = {c.name for c in _exception_classes(ast.parse(ERRORS_MODULE.read_text(encoding="utf-8")))}
    assert defined and defined <= set(colitools.errors.__all__)  # and colitools.errors re-exports each


@pytest.mark.parametrize("name", sorted(colitools.errors.__all__))
def test_colitools_errors_is_the_same_classes(name):
    assert getattr(colitools.errors, name) is getattr(errors, name)


def _renames(handler: ast.ExceptHandler) -> bool:
    """``except E as exc: raise Other(str(exc)) [from ...]``: the same message under another class."""
    if handler.name is None or len(handler.body) != 1 or not isinstance(handler.body[0], ast.Raise):
        return False
    exc = handler.body[0].exc
    if not (isinstance(exc, ast.Call) and len(exc.args) == 1 and not exc.keywords):
        return False
    arg = exc.args[0]
    same = isinstance(arg, ast.Name) and arg.id == handler.name
    as_str = (
        isinstance(arg, ast.Call)
        and isinstance(arg.func, ast.Name)
        and arg.func.id == "str"
        and len(arg.args) == 1
        and isinstance(arg.args[0], ast.Name)
        and arg.args[0].id == handler.name
    )
    return same or as_str


def _caught_names(handler: ast.ExceptHandler) -> set[str]:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in types if t is not None}


def test_no_catch_reraises_one_of_our_errors_only_to_rename_it():
    """Turning a foreign exception (``ValueError`` of ``json``) into one of ours is a translation and stays;
    catching one of ours to raise the same message as another class is what propagation already does."""
    ours = set(colitools.errors.__all__)
    renames = []
    for path in _library_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and _caught_names(node) & ours and _renames(node):
                renames.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not renames, "\n".join(renames)


def test_the_rename_check_sees_a_rename():
    """The check above is not vacuous: it flags the pattern it describes and passes a message that changes."""
    renamed = ast.parse(
        "try:\n    f()\nexcept ConfigError as exc:\n    raise ConvertError(str(exc)) from None\n"
    )
    changed = ast.parse(
        "try:\n    f()\nexcept ConfigError as exc:\n    raise ConvertError(f'{p}: {exc}') from None\n"
    )
    handlers = [next(n for n in ast.walk(t) if isinstance(n, ast.ExceptHandler)) for t in (renamed, changed)]
    assert [_renames(h) for h in handlers] == [True, False]


def test_exit_codes_per_class_are_the_documented_ones():
    """docs/CLI.md "Exit codes": 1 an error that stopped the command; 2 a usage error (an option value outside its range
    or choices, a --target refusal) and a mirror stage out of space; 3 convert --on-low-disk stop at the disk
    floor."""
    codes = {
        name: getattr(errors, name).exit_code
        for name in colitools.errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), errors.ColitoolsError)
    }
    assert {n: c for n, c in codes.items() if c != 1} == {
        "ParameterError": 2,
        "TargetRefused": 2,
        "MirrorReserveStop": 2,
        "DiskFloorStop": 3,
    }
