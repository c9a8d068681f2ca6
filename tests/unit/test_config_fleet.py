"""Fleet config keys: dns endpoints and nameservers, outlier, retries, repository_index, check_headers."""
from __future__ import annotations

import pytest

from gateway.config import HostPort, parse_config
from gateway.config.backends import Outlier
from gateway.errors import ConfigError

SECRET = "s3cr3t-t0ken-value"


def config(**backend) -> dict:
    body = {"protocol": "grpc", "endpoints": ["127.0.0.1:8001"], **backend}
    return {"backends": {"t": body}, "routes": [{"model": "m", "backend": "t"}]}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.problems


def named(found: list[str], key: str) -> bool:
    return any(p.startswith(key + ":") for p in found)


# -- dns endpoints -------------------------------------------------------------------

def test_dns_entries_and_static_endpoints():
    b = parse_config(config(endpoints=[{"dns": "triton.ns.svc:8001"}, "host:1", {"dns": "[fd00::1]:9"}])).backends["t"]
    assert b.endpoints == (HostPort("host", 1),)
    assert b.dns == (HostPort("triton.ns.svc", 8001), HostPort("fd00::1", 9))
    only_dns = parse_config(config(endpoints=[{"dns": "svc:8001"}])).backends["t"]
    assert only_dns.endpoints == () and only_dns.dns == (HostPort("svc", 8001),)


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"dns": "svc:8001", "port": 1}, "backends.t.endpoints[0].port"),
        ({"name": "svc:8001"}, "backends.t.endpoints[0].dns"),
        ({"dns": "svc"}, "backends.t.endpoints[0].dns"),
        ({"dns": "svc:http"}, "backends.t.endpoints[0].dns"),
        ({"dns": 8001}, "backends.t.endpoints[0].dns"),
    ],
)
def test_bad_dns_entry_names_its_key(entry, key):
    found = problems(config(endpoints=[entry]))
    assert named(found, key), found


def test_duplicate_dns_names():
    assert named(problems(config(endpoints=[{"dns": "svc:1"}, {"dns": "svc:1"}])), "backends.t")


# -- top-level dns -------------------------------------------------------------------

def test_nameservers_forms():
    cfg = parse_config(dict(config(), dns={
        "nameservers": ["10.0.0.10", "10.0.0.11:5353", "[fd00::53]:5300", "fd00::54"],
        "refresh_s": 1, "timeout_s": 0.5}))
    assert cfg.dns.nameservers == (HostPort("10.0.0.10", 53), HostPort("10.0.0.11", 5353),
                                   HostPort("fd00::53", 5300), HostPort("fd00::54", 53))
    assert (cfg.dns.refresh_s, cfg.dns.timeout_s) == (1, 0.5)
    default = parse_config(config()).dns
    assert default.nameservers == () and default.refresh_s > 0


@pytest.mark.parametrize(
    ("dns", "key"),
    [
        ({"nameservers": "10.0.0.10"}, "dns.nameservers"),
        ({"nameservers": ["10.0.0.10", 53]}, "dns.nameservers[1]"),
        ({"nameservers": ["10.0.0.10:99999"]}, "dns.nameservers[0]"),
        ({"nameservers": ["10.0.0.10:dns"]}, "dns.nameservers[0]"),
        ({"nameservers": [""]}, "dns.nameservers[0]"),
        ({"refresh_s": "often"}, "dns.refresh_s"),
        ({"timeout_s": True}, "dns.timeout_s"),
        ({"refresh_s": 0}, "dns"),
        ({"resolvers": []}, "dns.resolvers"),
        ("8.8.8.8", "dns"),
    ],
)
def test_bad_dns_section_names_its_key(dns, key):
    found = problems(dict(config(), dns=dns))
    assert named(found, key), found


@pytest.mark.parametrize("name", ["resolver.local", "resolver.local:53"])
def test_nameserver_must_be_an_ip_address(name):
    assert named(problems(dict(config(), dns={"nameservers": [name]})), "dns.nameservers[0]")


# -- outlier, retries, budget, index -------------------------------------------------

def test_outlier_mapping():
    b = parse_config(config(outlier={"consecutive_failures": 2, "base_ejection_s": 1,
                                     "max_ejection_s": 4.5, "max_ejection_percent": 50})).backends["t"]
    assert b.outlier == Outlier(2, 1.0, 4.5, 50.0)
    assert parse_config(config(outlier=None)).backends["t"].outlier == Outlier()
    assert parse_config(config(outlier={})).backends["t"].outlier == Outlier()


@pytest.mark.parametrize(
    ("outlier", "key"),
    [
        (5, "backends.t.outlier"),
        ({"consecutive_failures": 1.5}, "backends.t.outlier.consecutive_failures"),
        ({"consecutive_failures": True}, "backends.t.outlier.consecutive_failures"),
        ({"base_ejection_s": "30s"}, "backends.t.outlier.base_ejection_s"),
        ({"consecutive_failures": 0}, "backends.t.outlier"),
        ({"base_ejection_s": 60, "max_ejection_s": 30}, "backends.t.outlier"),
        ({"max_ejection_percent": 101}, "backends.t.outlier"),
        ({"interval": 1}, "backends.t.outlier.interval"),
    ],
)
def test_bad_outlier_names_its_key(outlier, key):
    found = problems(config(outlier=outlier))
    assert named(found, key), found


@pytest.mark.parametrize("retries", [0, 1, 5])
def test_retries_in_bounds(retries):
    assert parse_config(config(retries=retries)).backends["t"].retries == retries


@pytest.mark.parametrize(("retries", "key"), [(-1, "backends.t"), (6, "backends.t"),
                                              (1.5, "backends.t.retries"), ("2", "backends.t.retries")])
def test_retries_out_of_bounds(retries, key):
    found = problems(config(retries=retries))
    assert named(found, key) and any("retries" in p for p in found), found


def test_retry_budget_percent():
    assert parse_config(config()).backends["t"].retry_budget_percent == 20.0
    assert parse_config(config(retry_budget_percent=100)).backends["t"].retry_budget_percent == 100
    for bad, key in ((0, "backends.t"), (150, "backends.t"), ("20%", "backends.t.retry_budget_percent")):
        found = problems(config(retry_budget_percent=bad))
        assert named(found, key) and any("retry_budget_percent" in p for p in found), found


def test_repository_index_flag():
    assert parse_config(config()).backends["t"].repository_index is True
    assert parse_config(config(repository_index=False)).backends["t"].repository_index is False
    assert named(problems(config(repository_index="no")), "backends.t.repository_index")


# -- check_headers -------------------------------------------------------------------

def test_check_headers_from_env_and_file(monkeypatch, tmp_path):
    monkeypatch.setenv("OIP_TEST_REPO_KEY", SECRET)
    secret_file = tmp_path / "token"
    secret_file.write_text("from-a-file\n")  # a mounted Secret ends with a newline
    b = parse_config(config(check_headers={"x-repo-key": {"env": "OIP_TEST_REPO_KEY"},
                                           "authorization": {"file": str(secret_file)}})).backends["t"]
    assert b.check_headers == (("x-repo-key", SECRET), ("authorization", "from-a-file"))
    assert SECRET not in repr(b)


def test_missing_env_and_unreadable_file_name_the_key(monkeypatch, tmp_path):
    monkeypatch.delenv("OIP_TEST_UNSET", raising=False)
    monkeypatch.setenv("OIP_TEST_GOOD", SECRET)
    found = problems(config(check_headers={"x-a": {"env": "OIP_TEST_UNSET"},
                                           "x-b": {"file": str(tmp_path / "missing")},
                                           "x-c": {"env": "OIP_TEST_GOOD"}}))
    assert named(found, "backends.t.check_headers.x-a.env") and "OIP_TEST_UNSET" in " ".join(found)
    assert named(found, "backends.t.check_headers.x-b.file"), found
    assert not named(found, "backends.t.check_headers.x-c")
    assert not any(SECRET in p for p in found), found  # the good value read alongside is not echoed


@pytest.mark.parametrize("value", [f"{SECRET}\nInjected: 1", ""])
def test_bad_secret_values_are_not_echoed(monkeypatch, tmp_path, value):
    monkeypatch.setenv("OIP_TEST_BAD", value)
    path = tmp_path / "bad"
    path.write_text(f"{SECRET}\r\nx")
    found = problems(config(check_headers={"x-a": {"env": "OIP_TEST_BAD"}, "x-b": {"file": str(path)}}))
    assert named(found, "backends.t.check_headers.x-a") and named(found, "backends.t.check_headers.x-b"), found
    assert not any(SECRET in p for p in found), found


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"X-Repo-Key": {"env": "HOME"}}, "backends.t.check_headers.X-Repo-Key"),
        ({"bad name": {"env": "HOME"}}, "backends.t.check_headers.bad name"),
        ({"x-a": SECRET}, "backends.t.check_headers.x-a"),  # a literal secret is refused
        ({"x-a": {"env": "HOME", "file": "/etc/hostname"}}, "backends.t.check_headers.x-a"),
        ({"x-a": {"vault": "k"}}, "backends.t.check_headers.x-a"),
        ({"x-a": {"env": ""}}, "backends.t.check_headers.x-a.env"),
        (["x-a"], "backends.t.check_headers"),
    ],
)
def test_bad_check_headers_name_the_key(headers, key):
    found = problems(config(check_headers=headers))
    assert named(found, key), found
    assert not any(SECRET in p for p in found), found
