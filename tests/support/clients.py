"""One call shape over tritonclient's four clients (http, grpc and their asyncio variants).

Tests compare what a client gets through the gateway with what the same client
gets straight from the backend, so every client is driven identically here.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2  # Triton's service: ModelStreamInfer's messages

__all__ = ["CLIENTS", "In", "Out", "Result", "infer", "metadata", "protocol_of", "readiness", "stream_infer"]

CLIENTS = ("http", "grpc", "http_aio", "grpc_aio")


def protocol_of(kind: str) -> str:
    return "http" if kind.startswith("http") else "grpc"


@dataclass(frozen=True)
class In:
    name: str
    array: np.ndarray
    datatype: str
    binary: bool = True  # HTTP only: binary extension vs JSON data


@dataclass(frozen=True)
class Out:
    name: str
    binary: bool = False  # HTTP only


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    id: str
    model_name: str
    response: dict[str, Any] = field(default_factory=dict)


def _inputs(mod, ins: list[In], http: bool):
    made = []
    for i in ins:
        x = mod.InferInput(i.name, list(i.array.shape), i.datatype)
        if http:
            x.set_data_from_numpy(i.array, binary_data=i.binary)
        else:
            x.set_data_from_numpy(i.array)
        made.append(x)
    return made


def _outputs(mod, outs: list[Out] | None, http: bool):
    if outs is None:
        return None
    if http:
        return [mod.InferRequestedOutput(o.name, binary_data=o.binary) for o in outs]
    return [mod.InferRequestedOutput(o.name) for o in outs]


def _result(res, outs_names: list[str] | None, http: bool) -> Result:
    resp = res.get_response() if http else res.get_response(as_json=True)
    names = outs_names or [o["name"] for o in resp["outputs"]]
    return Result(
        outputs={n: res.as_numpy(n) for n in names},
        id=resp.get("id", ""),
        model_name=resp.get("model_name", ""),
        response=resp,
    )


def infer(kind: str, url: str, model: str, ins: list[In], outs: list[Out] | None = None,
          request_id: str = "", version: str = "", client: Any = None, **kw: Any) -> Result:
    """``client``: an ``http`` / ``grpc`` tritonclient the caller keeps open (else one of its own,
    closed after the request)."""
    names = [o.name for o in outs] if outs else None
    if kind == "http":
        mod = httpclient
        with contextlib.nullcontext(client) if client is not None else \
                mod.InferenceServerClient(url, network_timeout=120, connection_timeout=120) as c:
            r = c.infer(model, _inputs(mod, ins, True), model_version=version,
                        outputs=_outputs(mod, outs, True), request_id=request_id, **kw)
        return _result(r, names, True)
    if kind == "grpc":
        mod = grpcclient
        with contextlib.nullcontext(client) if client is not None else mod.InferenceServerClient(url) as c:
            r = c.infer(model, _inputs(mod, ins, False), model_version=version,
                        outputs=_outputs(mod, outs, False), request_id=request_id, **kw)
        return _result(r, names, False)
    if kind == "http_aio":
        async def run_http():
            c = httpaio.InferenceServerClient(url, conn_timeout=120)
            try:
                r = await c.infer(model, _inputs(httpclient, ins, True), model_version=version,
                                  outputs=_outputs(httpclient, outs, True), request_id=request_id, **kw)
            finally:
                await c.close()
            return _result(r, names, True)
        return asyncio.run(run_http())
    if kind == "grpc_aio":
        async def run_grpc():
            c = grpcaio.InferenceServerClient(url)
            try:
                r = await c.infer(model, _inputs(grpcclient, ins, False), model_version=version,
                                  outputs=_outputs(grpcclient, outs, False), request_id=request_id, **kw)
            finally:
                await c.close()
            return _result(r, names, False)
        return asyncio.run(run_grpc())
    raise ValueError(kind)


def metadata(kind: str, url: str, model: str | None = None) -> Any:
    """Server metadata (model None) or model metadata, as JSON-like dicts."""
    if kind.startswith("http"):
        with httpclient.InferenceServerClient(url) as c:
            return c.get_server_metadata() if model is None else c.get_model_metadata(model)
    with grpcclient.InferenceServerClient(url) as c:
        msg = c.get_server_metadata(as_json=True) if model is None else c.get_model_metadata(model, as_json=True)
        return msg


def readiness(kind: str, url: str, model: str) -> tuple[bool, bool, bool]:
    if kind.startswith("http"):
        with httpclient.InferenceServerClient(url) as c:
            return c.is_server_live(), c.is_server_ready(), c.is_model_ready(model)
    with grpcclient.InferenceServerClient(url) as c:
        return c.is_server_live(), c.is_server_ready(), c.is_model_ready(model)


# Channel options of a client sending and receiving tensors up to 64 MiB.
LARGE_MESSAGES = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def stream_infer(url: str, big: np.ndarray, count: int, model: str = "identity_FP32",
                 channel: grpc.Channel | None = None) -> list[np.ndarray]:
    """``count`` requests of ``big`` (FP32) to ``model`` on one ModelStreamInfer stream,
    synchronously (tritonclient's stream answers through a callback); the first output of each
    answer, in order. An answer carrying an error fails. ``channel``: one the caller keeps open
    (else one of its own, closed after the stream)."""
    if channel is None:
        with grpc.insecure_channel(url, options=LARGE_MESSAGES) as ch:
            return stream_infer(url, big, count, model, ch)

    def request() -> bytes:
        msg = service_pb2.ModelInferRequest(model_name=model)
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=list(big.shape))
        msg.raw_input_contents.append(big.tobytes())
        return msg.SerializeToString()

    outs = []
    call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    for raw in call(iter([request() for _ in range(count)]), timeout=120):
        answer = service_pb2.ModelStreamInferResponse.FromString(raw)
        assert not answer.error_message, answer.error_message
        outs.append(np.frombuffer(answer.infer_response.raw_output_contents[0], dtype=np.float32))
    return outs
