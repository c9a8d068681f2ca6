"""A request of a sequence — one carrying a ``sequence_id``, or any request of a route marked
``stateful`` — is never sent to a backend twice once any of its bytes were written (docs/config.md
"Safe retries"): a backend that resets the connection after reading it gets it once, and the
client a 502 / UNAVAILABLE saying it was not sent again. Any other request reset before a byte of
its answer goes to the backend's next endpoint (the backend's one retry)."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.badbackend import BadBackend
from tests.support.gateway import GatewayProcess, gateway_config
from tests.support.procs import wait_for


@pytest.fixture(params=[False, True], ids=["plain-route", "stateful-route"])
def setup(request, tmp_path):
    stateful = request.param
    with BadBackend("reset_before") as one, BadBackend("reset_before") as two:
        backends = {"p": {"protocol": "http", "endpoints": [one.address, two.address], "retries": 1,
                          "timeout_s": 5, "outlier": {"consecutive_failures": 1000}}}
        route = {"model": "bad", "backend": "p", **({"stateful": True} if stateful else {})}
        gw = GatewayProcess(gateway_config(backends, [route]), tmp_path, name="gateway-stateful").start()
        try:
            def ready() -> bool:
                with httpclient.InferenceServerClient(gw.http_url) as c:
                    return c.is_server_ready()

            wait_for(ready, timeout=30, what="gateway readiness")
            yield gw, (one, two), stateful
        finally:
            gw.stop()


def _infer(kind: str, url: str, sequence_id: int) -> InferenceServerException:
    mod = httpclient if kind == "http" else grpcclient
    with mod.InferenceServerClient(url) as c:
        inp = mod.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
        with pytest.raises(InferenceServerException) as caught:
            c.infer("bad", [inp], sequence_id=sequence_id, sequence_start=bool(sequence_id))
    return caught.value


@pytest.mark.parametrize("kind", ["http", "grpc"])
@pytest.mark.parametrize("sequence_id", [0, 42], ids=["no-sequence", "sequence"])
def test_a_stateful_request_is_sent_once(setup, kind, sequence_id):
    gw, backends, stateful_route = setup
    before = [b.infers for b in backends]
    err = _infer(kind, gw.http_url if kind == "http" else gw.grpc_url, sequence_id)
    each = [b.infers - n for b, n in zip(backends, before)]
    sent = sum(each)
    if stateful_route or sequence_id:
        assert sent == 1, f"a stateful request was sent {sent} times"
        assert str(err.status()) in ("502", "StatusCode.UNAVAILABLE"), err
        assert "not sent again" in err.message() and "'p'" in err.message(), err.message()
    else:
        # On each endpoint at most twice: a reused keep-alive connection closed before the answer is
        # the keep-alive race, sent once more on a fresh one; then the next endpoint (retries: 1).
        assert all(1 <= n <= 2 for n in each), f"a plain request reset before its answer was sent {each} times"
        assert str(err.status()) in ("503", "StatusCode.UNAVAILABLE"), err
