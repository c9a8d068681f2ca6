"""Per-endpoint health (routing/readiness.py) and Outlier.may_eject: pure state, explicit clocks."""
from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.config.backends import Outlier
from gateway.config.schema import Health
from gateway.errors import ConfigError
from gateway.routing.readiness import EndpointHealth, Ready


def indexed(*entries: tuple[str, str, bool]) -> EndpointHealth:
    h = EndpointHealth()
    h.set_live(True)
    h.set_index(list(entries))
    return h


# -- liveness ------------------------------------------------------------------------

def test_new_endpoint_is_not_usable_before_a_check():
    h = EndpointHealth()
    assert h.live is None and not h.usable()
    h.set_live(True)
    assert h.usable()
    h.set_live(False)
    assert not h.usable()


def test_server_coming_back_forgets_its_models():
    h = indexed(("m", "1", True))
    h.set_model(("x", ""), True)
    h.set_live(False)
    assert h.names is None and h.index is None and not h.per_model
    h.set_index([("m", "1", True)])  # stale state written while down
    h.set_model(("x", ""), True)
    h.set_live(True)  # a new process: nothing known until checked again
    assert h.names is None and h.index is None and not h.per_model
    assert h.ready_for("m", "1") == Ready.NO  # no traffic before its models are checked
    h.models_checked = True  # the checker's round found no index and no per-model answer
    assert h.ready_for("m", "1") == Ready.UNKNOWN


def test_staying_live_keeps_what_is_known():
    h = indexed(("m", "1", True))
    h.set_live(True)
    assert h.ready_for("m", "1") == Ready.YES
    p = EndpointHealth()
    p.set_live(True)
    p.set_model(("m", ""), True)
    p.set_live(True)
    assert p.per_model == {("m", ""): True}


# -- thresholds (Envoy's unhealthy_threshold / healthy_threshold) ---------------------

def test_first_check_decides_at_once_either_way():
    up = EndpointHealth()
    up.checked(True, 3, 2)
    assert up.live is True and up.usable()
    down = EndpointHealth()
    down.checked(False, 3, 2)
    assert down.live is False and not down.usable()


def test_a_live_endpoint_goes_down_on_the_third_failed_check_in_a_row():
    h = indexed(("m", "1", True))
    gen = h.gen.n
    for _ in range(2):
        h.checked(False, 3, 1)
        assert h.live is True and h.ready_for("m", "1") == Ready.YES  # what is known stays
    assert h.gen.n == gen  # nothing that decides routing moved: cached choices stay valid
    h.checked(False, 3, 1)
    assert h.live is False and not h.usable() and h.names is None


def test_a_good_check_between_failures_starts_the_count_again():
    h = indexed(("m", "1", True))
    for _ in range(10):
        h.checked(False, 3, 1)
        h.checked(False, 3, 1)
        h.checked(True, 3, 1)
    assert h.live is True and h.ready_for("m", "1") == Ready.YES


def test_succeeded_traffic_clears_failed_checks_but_never_brings_an_endpoint_up():
    h = indexed(("m", "1", True))
    for _ in range(10):
        h.checked(False, 3, 1)
        h.checked(False, 3, 1)
        h.succeeded()  # an inference that succeeded there: evidence of liveness
    assert h.live is True and h.check_failures == 0
    h.checked(False, 3, 1)
    h.checked(False, 3, 1)
    h.checked(False, 3, 1)
    assert h.live is False
    h.succeeded()
    assert h.live is False  # only a check brings it back (its models are checked first)


def test_healthy_threshold_good_checks_in_a_row_bring_it_back_as_a_new_process():
    h = indexed(("m", "1", True))
    h.set_live(False)  # (a refused connection on live traffic: out at once)
    h.checked(True, 3, 2)
    assert h.live is False
    h.checked(False, 3, 2)  # a failure in between: the count starts again
    h.checked(True, 3, 2)
    assert h.live is False
    h.checked(True, 3, 2)
    assert h.live is True
    assert h.ready_for("m", "1") == Ready.NO  # nothing ready before its models are checked again
    one = EndpointHealth()
    one.checked(False, 3, 1)
    one.checked(True, 3, 1)
    assert one.live is True


def test_threshold_one_is_the_old_behaviour():
    h = indexed(("m", "1", True))
    h.checked(False, 1, 1)
    assert h.live is False
    h.checked(True, 1, 1)
    assert h.live is True and not h.models_checked


def test_a_missing_index_keeps_the_last_one_until_the_threshold():
    h = indexed(("m", "1", True))
    assert h.index_missing(3) is True
    assert h.index_missing(3) is True
    assert h.ready_for("m", "1") == Ready.YES and h.names is not None
    assert h.index_missing(3) is False  # the third round in a row: per-model calls decide
    fresh = indexed(("m", "1", True))
    fresh.index_missing(3)
    fresh.index_missing(3)
    fresh.set_index([("m", "1", True)])  # it came back: the count starts again
    assert fresh.index_missing(3) is True and fresh.index_missing(3) is True
    never = EndpointHealth()
    never.set_live(True)
    assert never.index_missing(3) is False  # no index known: nothing to keep


# -- the health section's thresholds --------------------------------------------------

CONFIG = {"backends": {"t": {"protocol": "http", "endpoints": ["127.0.0.1:8000"]}},
          "routes": [{"model": "m", "backend": "t"}]}


def test_thresholds_default_and_load():
    assert (Health().unhealthy_threshold, Health().healthy_threshold) == (3, 1)
    cfg = parse_config({**CONFIG, "health": {"unhealthy_threshold": 5, "healthy_threshold": 2}})
    assert (cfg.health.unhealthy_threshold, cfg.health.healthy_threshold) == (5, 2)
    assert parse_config(CONFIG).health == Health()


@pytest.mark.parametrize("key", ["unhealthy_threshold", "healthy_threshold"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3"])
def test_thresholds_are_integers_of_at_least_one(key, value):
    with pytest.raises(ConfigError) as info:
        parse_config({**CONFIG, "health": {key: value}})
    assert any(f"health.{key}" in p or key in p for p in info.value.problems), info.value.problems


# -- model readiness -----------------------------------------------------------------

def test_index_readiness_needs_the_exact_version_when_one_is_asked():
    h = indexed(("m", "1", True), ("m", "2", False), ("loading", "1", False), ("bare", "", False))
    assert h.ready_for("m", "1") == Ready.YES
    assert h.ready_for("m", "2") == Ready.NO
    assert h.ready_for("m", "3") == Ready.NO
    assert h.ready_for("m", "") == Ready.YES  # some version is ready
    assert h.ready_for("loading", "") == Ready.NO
    assert h.ready_for("bare", "") == Ready.NO
    assert h.ready_for("never-heard-of", "") == Ready.NO  # the index is the whole truth


def test_per_model_check_without_version_counts_for_any_version():
    h = EndpointHealth()
    h.set_live(True)
    assert h.ready_for("m", "") == Ready.NO  # not checked since it came up
    h.models_checked = True
    assert h.ready_for("m", "") == Ready.UNKNOWN
    h.set_model(("m", ""), True)
    assert h.ready_for("m", "") == Ready.YES
    assert h.ready_for("m", "7") == Ready.YES
    h.set_model(("m", "7"), False)  # a check of that very version wins over the unversioned one
    assert h.ready_for("m", "7") == Ready.NO
    assert h.ready_for("m", "8") == Ready.YES
    h.set_model(("v", "2"), True)
    assert h.ready_for("v", "2") == Ready.YES
    assert h.ready_for("v", "") == Ready.UNKNOWN  # a versioned check says nothing of others
    assert h.ready_for("v", "3") == Ready.UNKNOWN


def test_index_wins_over_per_model_state():
    h = EndpointHealth()
    h.set_live(True)
    h.set_model(("m", ""), True)
    h.set_index([("other", "1", True)])
    assert h.ready_for("m", "") == Ready.NO


def test_ready_exactly_is_not_inferred_from_another_version():
    h = EndpointHealth()
    h.set_live(True)
    h.set_model(("m", ""), True)
    assert h.ready_exactly("m", "")
    assert not h.ready_exactly("m", "4")  # ready_for says YES, but nobody checked version 4
    assert h.ready_for("m", "4") == Ready.YES
    i = indexed(("m", "1", True), ("m", "2", False))
    assert i.ready_exactly("m", "1") and i.ready_exactly("m", "")
    assert not i.ready_exactly("m", "2") and not i.ready_exactly("n", "")


def test_knows_tells_a_listed_model_from_an_unknown_one():
    h = indexed(("loading", "1", False), ("ready", "1", True))
    assert h.knows("loading") and h.knows("ready") and not h.knows("nope")
    p = EndpointHealth()
    p.set_live(True)
    assert not p.knows("m")
    p.set_model(("m", "3"), False)
    assert p.knows("m") and not p.knows("n")


def test_not_ready_stops_the_model_on_an_indexed_endpoint():
    h = indexed(("m", "1", True), ("m", "2", True), ("n", "1", True))
    h.not_ready("m", "1")
    assert h.ready_for("m", "1") == Ready.NO and h.ready_for("m", "2") == Ready.NO
    assert h.ready_for("m", "") == Ready.NO
    assert h.ready_for("n", "1") == Ready.YES
    assert h.knows("m")  # still listed: "not ready", not "unknown"


def test_not_ready_marks_every_per_model_key_of_the_model():
    h = EndpointHealth()
    h.set_live(True)
    h.set_model(("m", ""), True)
    h.set_model(("n", ""), True)
    h.not_ready("m", "5")
    assert h.per_model == {("m", ""): False, ("m", "5"): False, ("n", ""): True}
    assert h.ready_for("m", "6") == Ready.NO
    fresh = EndpointHealth()
    fresh.set_live(True)
    fresh.not_ready("g", "")  # a glob-routed model never checked: now known not ready
    assert fresh.ready_for("g", "") == Ready.NO and fresh.knows("g")


# -- outlier ejection ----------------------------------------------------------------

OUTLIER = Outlier(consecutive_failures=3, base_ejection_s=10.0, max_ejection_s=25.0)


def fail_until_ejected(h: EndpointHealth, now: float) -> int:
    for n in range(1, 100):
        if h.failed(OUTLIER, now, may_eject=True):
            return n
    raise AssertionError("never ejected")


def test_consecutive_failures_eject_with_growing_capped_duration():
    h = EndpointHealth()
    h.set_live(True)
    assert fail_until_ejected(h, 100.0) == 3
    assert h.ejected_until == 110.0 and not h.usable()
    h.readmit(110.0)
    assert fail_until_ejected(h, 200.0) == 3
    assert h.ejected_until == 220.0  # twice the base
    h.readmit(220.0)
    assert fail_until_ejected(h, 300.0) == 3
    assert h.ejected_until == 325.0  # 30 s capped at max_ejection_s
    assert h.ejections == 3


def test_success_resets_the_count():
    h = EndpointHealth()
    h.set_live(True)
    for _ in range(5):
        assert not h.failed(OUTLIER, 0.0, may_eject=True)
        assert not h.failed(OUTLIER, 0.0, may_eject=True)
        h.succeeded()
    assert h.ejected_until is None and h.failures == 0


def test_no_ejection_when_the_backend_may_not_eject_more():
    h = EndpointHealth()
    for _ in range(10):
        assert not h.failed(OUTLIER, 0.0, may_eject=False)
    assert h.ejected_until is None
    assert h.failed(OUTLIER, 0.0, may_eject=True)  # once allowed, the next failure ejects


def test_already_ejected_is_not_ejected_again():
    h = EndpointHealth()
    fail_until_ejected(h, 0.0)
    until = h.ejected_until
    for _ in range(10):
        assert not h.failed(OUTLIER, 5.0, may_eject=True)
    assert h.ejected_until == until and h.ejections == 1


def test_readmit_only_once_the_time_is_up():
    h = EndpointHealth()
    h.set_live(True)
    fail_until_ejected(h, 50.0)
    h.readmit(59.999)
    assert h.ejected_until == 60.0 and not h.usable()
    h.readmit(1000.0)  # time up, but still out until the checker readmits: usable() has no clock
    assert h.ejected_until is None and h.usable()


# -- Outlier.may_eject ---------------------------------------------------------------

@pytest.mark.parametrize("percent", [0.0, 10.0, 50.0])
@pytest.mark.parametrize("total", [2, 3, 10])
def test_one_of_several_endpoints_may_always_be_ejected(percent, total):
    assert Outlier(max_ejection_percent=percent).may_eject(0, total)


@pytest.mark.parametrize("percent", [0.0, 10.0, 50.0, 99.0])
def test_a_lone_endpoint_is_never_ejected(percent):
    assert not Outlier(max_ejection_percent=percent).may_eject(0, 1)


def test_percent_bounds_further_ejections():
    ten = Outlier(max_ejection_percent=10.0)
    assert not ten.may_eject(1, 10)  # 2 of 10 would be 20 %
    assert ten.may_eject(1, 20)  # 2 of 20 is 10 %
    assert not ten.may_eject(2, 20)
    half = Outlier(max_ejection_percent=50.0)
    assert half.may_eject(1, 4) and not half.may_eject(2, 4)
    assert not Outlier(max_ejection_percent=0.0).may_eject(1, 100)
