"""The hot-path modules run compiled wherever the build could compile them (setup.py), and
the compiled code is the checkout's own, not an older build."""
from __future__ import annotations

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
