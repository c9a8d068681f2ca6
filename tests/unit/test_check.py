"""``oip-gateway check`` away from where the config runs (issue 37).

A file or environment variable the config names that does not exist on this machine (a
Secret mounted, a variable set, only in the pod) is a note, not a failure, unless
``--strict`` — which, like ``serve`` (always strict), refuses it. What exists is read and
checked either way: a file that is not PEM, a bad JWKS, a short key still fail.
"""
from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

from gateway.cli import main
from gateway.config import load_config, parse_config
from gateway.config.loader import check_config
from gateway.config.parsing import NOT_HERE_SECRET, Presence
from gateway.errors import ConfigError

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
ABSENT_VARS = ("OIP_TEST_ABSENT_ADMIN", "OIP_TEST_ABSENT_OPS")


@pytest.fixture(autouse=True)
def _absent_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ABSENT_VARS:
        monkeypatch.delenv(var, raising=False)


def pod_config(where: pathlib.Path) -> dict:
    """A config naming, besides what exists here, files under ``where/pod`` (absent) and
    variables that are not set: what a config rendered from the chart looks like on a laptop."""
    pod = where / "pod"
    return {
        "listen": {"tls": {"cert": f"{pod}/tls/tls.crt", "key": f"{pod}/tls/tls.key",
                           "client_ca": f"{pod}/tls/ca.crt"}},
        "backends": {
            "triton": {"protocol": "grpc", "endpoints": ["triton:8001"],
                       "tls": {"ca": f"{pod}/triton-ca/ca.crt", "server_name": "triton.models.svc"},
                       "check_headers": {"admin-key": {"env": "OIP_TEST_ABSENT_ADMIN"},
                                         "other-key": {"file": f"{pod}/admin/other-key"}}},
        },
        "routes": [{"model": "*", "backend": "triton"}],
        "auth": {"keys": [{"name": "team", "key": {"file": f"{pod}/keys/team"}},
                          {"name": "ops", "key": {"env": "OIP_TEST_ABSENT_OPS"}, "control": True}],
                 "jwt": {"jwks_file": f"{pod}/jwks/jwks.json"}},
    }


# (key, what the note names) of every pod-only reference of pod_config.
def expected_notes(where: pathlib.Path) -> list[tuple[str, str]]:
    pod = where / "pod"
    return [("listen.tls.cert", f"{pod}/tls/tls.crt"), ("listen.tls.key", f"{pod}/tls/tls.key"),
            ("listen.tls.client_ca", f"{pod}/tls/ca.crt"),
            ("backends.triton.check_headers.admin-key.env", "environment variable OIP_TEST_ABSENT_ADMIN"),
            ("backends.triton.check_headers.other-key.file", f"{pod}/admin/other-key"),
            ("backends.triton.tls.ca", f"{pod}/triton-ca/ca.crt"),
            ("auth.keys[0].key.file", f"{pod}/keys/team"),
            ("auth.keys[1].key.env", "environment variable OIP_TEST_ABSENT_OPS"),
            ("auth.jwt.jwks_file", f"{pod}/jwks/jwks.json")]


def write(path: pathlib.Path, raw: dict) -> pathlib.Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def test_lenient_notes_each_absent_file_and_variable(tmp_path):
    found = check_config(write(tmp_path / "c.yaml", pod_config(tmp_path)), Presence.LENIENT)
    assert found.problems == ()
    assert sorted(found.notes) == sorted(f"{key}: {what} not present here (checked inside the pod)"
                                         for key, what in expected_notes(tmp_path))
    config = found.config
    assert config is not None and config.auth is not None and config.listen.tls is not None
    # Everything else was built and validated; a secret not present here stands as a value
    # no header or bearer credential can carry (the config is for checking only).
    assert [k.value for k in config.auth.keys] == [NOT_HERE_SECRET, NOT_HERE_SECRET]
    assert "\0" in NOT_HERE_SECRET
    assert config.backends["triton"].tls is not None and config.backends["triton"].tls.server_name


def test_strict_refuses_them_as_serve_does(tmp_path):
    path = write(tmp_path / "c.yaml", pod_config(tmp_path))
    found = check_config(path, Presence.STRICT)
    assert found.config is None and found.notes == ()
    assert sorted(p.split(": ")[0] for p in found.problems) == sorted(k for k, _ in expected_notes(tmp_path))
    # serve (and every reload) loads strictly, with the messages it always had.
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert sorted(info.value.problems) == sorted(found.problems)
    text = "\n".join(found.problems)
    assert "backends.triton.check_headers.admin-key.env: environment variable OIP_TEST_ABSENT_ADMIN is not set" \
        in text
    assert f"listen.tls.cert: cannot read {tmp_path}/pod/tls/tls.crt: No such file or directory" in text
    assert f"auth.jwt.jwks_file: cannot read {tmp_path}/pod/jwks/jwks.json: No such file or directory" in text
    with pytest.raises(ConfigError):
        parse_config(pod_config(tmp_path))


def test_cli(tmp_path, capsys):
    path = write(tmp_path / "c.yaml", pod_config(tmp_path))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[-1] == f"{path}: OK (1 backends, 1 routes); 9 file(s) or variable(s) not present here, " \
                        "not checked (--strict requires them)"
    assert sorted(lines[:-1]) == sorted(f"note: {key}: {what} not present here (checked inside the pod)"
                                        for key, what in expected_notes(tmp_path))
    assert out.err == ""
    assert main(["check", "--strict", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines()[-1] == f"{path}: 9 problem(s)"
    assert "error: listen.tls.key: cannot read" in out.err


def test_strict_or_not_the_same_when_everything_is_here(tmp_path, monkeypatch, capsys):
    """Files present and variables set: --strict changes nothing, and nothing is noted."""
    raw = pod_config(tmp_path)
    for key, what in expected_notes(tmp_path):
        if what.startswith("environment variable "):
            monkeypatch.setenv(what.rsplit(" ", 1)[1], "s3cret-0123456789abcdef")
            continue
        f = pathlib.Path(what)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"keys": []}) if key == "auth.jwt.jwks_file" else
                     PEM if ".tls." in key else "s3cret-0123456789abcdef\n")
    path = write(tmp_path / "c.yaml", raw)
    for presence in Presence:
        found = check_config(path, presence)
        assert found.problems == () and found.notes == (), presence
        assert found.config is not None and found.config.auth is not None
        assert [k.value for k in found.config.auth.keys] == ["s3cret-0123456789abcdef"] * 2
    assert load_config(path).auth is not None
    for strict in ([], ["--strict"]):
        assert main(["check", *strict, str(path)]) == 0
        assert capsys.readouterr().out == f"{path}: OK (1 backends, 1 routes)\n"


@pytest.mark.parametrize("presence", list(Presence))
def test_present_but_invalid_fails_either_way(tmp_path, monkeypatch, presence):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "cert.txt").write_text("not a certificate\n")
    (bad / "jwks.json").write_text("{not json")
    (bad / "short").write_text("abc\n")
    (bad / "two-lines").write_text("a-long-enough-value\nsecond line\n")
    (bad / "latin1").write_bytes(b"caf\xe9-0123456789abcdef")
    monkeypatch.setenv("OIP_TEST_ABSENT_OPS", "")
    raw = {
        "listen": {"tls": {"cert": str(bad / "cert.txt"), "key": str(bad)}},  # a directory: exists, unreadable
        "backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"], "tls": {"ca": str(bad / "cert.txt")},
                           "check_headers": {"x-a": {"file": str(bad / "two-lines")},
                                             "x-b": {"file": str(bad / "latin1")}}}},
        "routes": [{"model": "m", "backend": "t"}],
        "auth": {"keys": [{"name": "short", "key": {"file": str(bad / "short")}},
                          {"name": "empty", "key": {"env": "OIP_TEST_ABSENT_OPS"}}],
                 "jwt": {"jwks_file": str(bad / "jwks.json")}},
    }
    found = check_config(write(tmp_path / "c.yaml", raw), presence)
    assert found.config is None and found.notes == ()
    text = "\n".join(found.problems)
    for needle in (f"listen.tls.cert: {bad}/cert.txt is not a PEM file", f"listen.tls.key: cannot read {bad}: ",
                   f"backends.t.tls.ca: {bad}/cert.txt is not a PEM file",
                   "backends.t.check_headers.x-a: the value is empty or holds a line break",
                   f"backends.t.check_headers.x-b.file: {bad}/latin1 is not UTF-8 text",
                   "auth.keys[0].key: too short", "auth.keys[1].key: the value is empty or holds a line break",
                   f"auth.jwt.jwks_file: {bad}/jwks.json is not a JWKS document"):
        assert needle in text, (needle, text)
    assert "abc" not in text and "a-long-enough-value" not in text  # never a secret's value


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_a_problem_even_lenient(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-0123456789abcdef\n")
    key.chmod(0)
    raw = {"backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"], "check_headers": {"k": {"file": str(key)}}}},
           "routes": [{"model": "m", "backend": "t"}]}
    found = check_config(write(tmp_path / "c.yaml", raw), Presence.LENIENT)
    assert found.problems == (f"backends.t.check_headers.k.file: cannot read {key}: Permission denied",)


def test_other_problems_fail_with_the_notes_shown(tmp_path, capsys):
    """Lenient is only about presence: any other problem fails the check, notes still listed."""
    raw = dict(pod_config(tmp_path), workers="two")
    path = write(tmp_path / "c.yaml", raw)
    found = check_config(path, Presence.LENIENT)
    assert found.config is None and len(found.notes) == 9
    assert [p.split(":")[0] for p in found.problems] == ["workers"]
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out.count("not present here") == 9
    assert "error: workers:" in out.err and out.err.splitlines()[-1] == f"{path}: 1 problem(s)"


def test_a_missing_path_component_is_absent_too(tmp_path):
    """/etc/oip/tls/tls.crt below a file (ENOTDIR) is as absent as below a missing directory."""
    (tmp_path / "file").write_text("x")
    raw = {"listen": {"tls": {"cert": str(tmp_path / "file" / "tls.crt"), "key": str(tmp_path / "no" / "tls.key")}},
           "backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"]}}, "routes": [{"model": "m", "backend": "t"}]}
    found = check_config(write(tmp_path / "c.yaml", raw), Presence.LENIENT)
    assert found.problems == () and [n.split(":")[0] for n in found.notes] == ["listen.tls.cert", "listen.tls.key"]


@pytest.mark.parametrize("presence", list(Presence))
def test_a_path_with_a_nul_is_a_problem(tmp_path, presence):
    (tmp_path / "tls.key").write_text(PEM)
    raw = {"listen": {"tls": {"cert": "/etc/tls\0.crt", "key": str(tmp_path / "tls.key")}},
           "backends": {"t": {"protocol": "grpc", "endpoints": ["t:1"], "check_headers": {"k": {"file": "/a\0b"}}}},
           "routes": [{"model": "m", "backend": "t"}], "auth": {"jwt": {"jwks_file": "/j\0"}}}
    found = check_config(write(tmp_path / "c.yaml", raw), presence)
    assert sorted(p.split(":")[0] for p in found.problems) == [
        "auth.jwt.jwks_file", "backends.t.check_headers.k.file", "listen.tls.cert"], found.problems
    assert all("is not a path" in p for p in found.problems)


def test_config_file_itself_must_exist(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err
