"""The hot-path modules run compiled wherever the build could compile them (setup.py), and
the compiled code is the checkout's own, not an older build."""
from __future__ import annotations

import ast
import importlib

import pytest

from tests.support.compiled import REPO, compiled_sources, compiling_expected, extension_of, stale_extensions


def test_compiled_modules_are_what_is_imported():
    if not compiling_expected():
        pytest.skip("no C compiler here (or OIP_GATEWAY_COMPILE=0): the package runs as pure Python")
    for source in compiled_sources():
        assert source.exists(), source
        ext = extension_of(source)
        assert ext is not None, f"{source.relative_to(REPO)} has no built extension: `pip install -e .` compiles it"
        name = ".".join(source.relative_to(REPO).with_suffix("").parts)
        assert importlib.import_module(name).__file__ == str(ext)


def test_no_extension_is_older_than_its_source():
    assert stale_extensions() == []


def _except_names(fn: ast.AST) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.ExceptHandler) and node.name:
            names.setdefault(node.name, set()).add(ast.unparse(node.type) if node.type else "BaseException")
    return names


def test_no_compiled_function_binds_one_name_to_two_exception_types():
    """mypyc gives a local one type per function: ``except A as e`` then ``except B as e``
    types ``e`` as A, and a B caught there raises TypeError at run time (a 500 where the
    interpreter would have answered)."""
    found = []
    for source in compiled_sources():
        for fn in ast.walk(ast.parse(source.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{source.relative_to(REPO)}:{fn.lineno} {fn.name}: {name} as {sorted(types)}"
                          for name, types in _except_names(fn).items() if len(types) > 1]
    assert found == []
