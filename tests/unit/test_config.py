"""Config loading: valid files load into frozen dataclasses; every problem is named by its key."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest
import yaml

from gateway.config import DEFAULT_MAX_MESSAGE_BYTES, HostPort, load_config, parse_config
from gateway.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]

MINIMAL = {
    "backends": {"t": {"protocol": "grpc", "endpoints": ["127.0.0.1:8001"]}},
    "routes": [{"model": "m", "backend": "t"}],
}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.problems


def test_example_configs_load():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.backends and cfg.routes, path


def test_defaults():
    cfg = parse_config(MINIMAL)
    assert cfg.listen.http == HostPort("0.0.0.0", 8000)
    assert cfg.listen.grpc == HostPort("0.0.0.0", 8001)
    assert cfg.listen.metrics == HostPort("0.0.0.0", 8002)
    assert cfg.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 256 * 1024 * 1024
    assert cfg.backends["t"].max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    assert cfg.workers == 1


def test_config_is_frozen():
    cfg = parse_config(MINIMAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.workers = 3  # type: ignore[misc]


def test_version_int_becomes_string():
    raw = dict(MINIMAL, routes=[{"model": "m", "version": 2, "backend": "t"}])
    assert parse_config(raw).routes[0].version == "2"


def test_listener_can_be_disabled():
    raw = dict(MINIMAL, listen={"grpc": None, "metrics": None})
    cfg = parse_config(raw)
    assert cfg.listen.grpc is None and cfg.listen.metrics is None and cfg.listen.http is not None


@pytest.mark.parametrize(
    "raw, key",
    [
        (dict(MINIMAL, typo=1), "typo"),
        (dict(MINIMAL, listen={"http": "nohost"}), "listen.http"),
        (dict(MINIMAL, listen={"http": "h:99999"}), "listen.http"),
        (dict(MINIMAL, listen={"htp": "h:1"}), "listen.htp"),
        (dict(MINIMAL, backends={"t": {"protocol": "tcp", "endpoints": ["h:1"]}}), "backends.t.protocol"),
        (dict(MINIMAL, backends={"t": {"endpoints": ["h:1"]}}), "backends.t.protocol"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": []}}), "backends.t.endpoints"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h"]}}), "backends.t.endpoints[0]"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "timeout": 1}}),
         "backends.t.timeout"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "timeout_s": "x"}}),
         "backends.t.timeout_s"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "max_connections": 0}}),
         "backends.t"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "max_connections": 1.5}}),
         "backends.t.max_connections"),
        (dict(MINIMAL, routes=[{"model": "m", "backend": "nope"}]), "routes[0].backend"),
        (dict(MINIMAL, routes=[{"backend": "t"}]), "routes[0].model"),
        (dict(MINIMAL, routes=[]), "routes"),
        (dict(MINIMAL, backends={}), "backends"),
        (dict(MINIMAL, workers=0), "(config)"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "balance": "random"}}),
         "backends.t.balance"),
        (dict(MINIMAL, backends={"t": {"protocol": "http", "endpoints": ["h:1"], "non_utf8_bytes": "latin1"}}),
         "backends.t.non_utf8_bytes"),
        (dict(MINIMAL, max_inflight_bytes="lots"), "max_inflight_bytes"),
        (dict(MINIMAL, health={"interval_s": -1}), "health"),
        (dict(MINIMAL, limits={"max_elements": (1 << 56) + 1}), "limits"),
    ],
)
def test_each_problem_names_its_key(raw, key):
    found = problems(raw)
    assert any(p.startswith(key + ":") for p in found), found


def test_max_inflight_bytes():
    assert parse_config(MINIMAL).max_inflight_bytes is None  # unset: from the memory limit, else off
    assert parse_config(dict(MINIMAL, max_inflight_bytes=0)).max_inflight_bytes == 0  # off
    assert parse_config(dict(MINIMAL, max_inflight_bytes=1 << 30)).max_inflight_bytes == 1 << 30
    assert any("max_inflight_bytes must be >= 0" in p for p in problems(dict(MINIMAL, max_inflight_bytes=-1)))
    # Below the largest message, the largest request could never be admitted.
    found = problems(dict(MINIMAL, max_inflight_bytes=1000))
    assert any("below max_message_bytes" in p for p in found), found


def test_forward_headers():
    assert parse_config(dict(MINIMAL, forward_headers=["authorization", "x-tenant"])).forward_headers == (
        "authorization", "x-tenant")
    for bad in (["Authorization"], ["content-length"], ["grpc-timeout"], ["a b"]):
        assert any(p.startswith("(config): forward_headers") for p in problems(dict(MINIMAL, forward_headers=bad))), bad
    assert any(p.startswith("forward_headers:") for p in problems(dict(MINIMAL, forward_headers="authorization")))


def test_all_problems_reported_at_once():
    raw = {
        "listen": {"http": "x"},
        "backends": {"a": {"protocol": "http", "endpoints": []}},
        "routes": [{"model": "m", "backend": "zzz"}],
        "extra": True,
    }
    found = problems(raw)
    assert len(found) >= 4, found


def test_not_a_mapping():
    assert problems([1, 2])[0].startswith("(top level)")


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_check_command(tmp_path, capsys):
    from gateway.cli import main

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(MINIMAL))
    assert main(["check", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(dict(MINIMAL, workers="two")))
    assert main(["check", str(bad)]) == 1
    assert "workers" in capsys.readouterr().err


def test_every_problem_of_one_backend_is_reported():
    """A wrong protocol next to a wrong endpoint: both, in one run."""
    raw = {"backends": {"a": {"protocol": "htp", "endpoints": ["nohost"], "balance": "random"}},
           "routes": [{"model": "m", "backend": "a"}]}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    keys = [p.split(":")[0] for p in info.value.problems]
    assert {"backends.a.protocol", "backends.a.endpoints[0]", "backends.a.balance"} <= set(keys), keys


def test_help_lists_only_the_commands_for_people(capsys):
    from gateway.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "_worker" not in text and "SUPPRESS" not in text and "``" not in text
    for command in ("serve", "check", "demo", "reference"):
        assert command in text
    # The hidden command still works for the supervisor.
    assert build_parser().parse_args(["_worker", "--config", "x.yaml"]).command == "_worker"


def test_server_metadata_name_and_version():
    base = {"backends": {"b": {"protocol": "http", "endpoints": ["h:1"]}}, "routes": [{"model": "m", "backend": "b"}]}
    cfg = parse_config(dict(base, server={"name": "triton", "version": "2.51.0"}))
    assert (cfg.server_name, cfg.server_version) == ("triton", "2.51.0")
    assert parse_config(base).server_name is None
    with pytest.raises(ConfigError) as info:
        parse_config(dict(base, server={"name": "", "vendor": "x"}))
    assert {p.split(":")[0] for p in info.value.problems} == {"server.name", "server.vendor"}


def test_max_elements_is_capped_where_a_backends_byte_count_could_wrap():
    assert any("max_elements must be <= 2**56" in p for p in problems(dict(MINIMAL, limits={"max_elements": 1 << 60})))
    assert parse_config(dict(MINIMAL, limits={"max_elements": 1 << 56})).limits.max_elements == 1 << 56
