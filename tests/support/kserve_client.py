"""KServe's Python clients behind JSON lines: run by .kserve-venv's Python (tests/support/kserve.py).

kserve cannot be imported next to tritonclient (both define ``inference.*`` in protobuf's default
descriptor pool), so the tests drive ``kserve.InferenceRESTClient`` and
``kserve.InferenceGRPCClient`` through this process: one JSON object per line on stdin, one
answer per line on stdout. Clients are kept per (transport, url) for the life of the process.

Requests (``op`` and its fields):

- ``ping`` → ``{"ok": true, "kserve": VERSION}``
- ``infer``: ``transport`` (``rest`` | ``grpc``), ``url`` (``host:port``), ``model``, optional
  ``id``, ``parameters`` (request parameters), ``inputs`` — each ``{name, datatype, array,
  binary, parameters?}`` with ``array`` as tests/support/kserve.py ``encode_array`` writes it and
  ``binary``: REST binary-data extension / gRPC ``raw_input_contents`` (else JSON ``data`` /
  typed ``contents``) — and optional ``outputs``: ``[{name, binary}]`` (requested outputs;
  ``binary`` sets the output's ``binary_data`` parameter).
  → ``{"ok": true, "id", "model_name", "model_version", "parameters", "outputs": [{name,
  datatype, shape, parameters, form ("raw" | "typed" over gRPC, null over REST), array}]}``
- ``server_live``, ``server_ready``: ``transport``, ``url``; ``model_ready``: also ``model``
  → ``{"ok": true, "value": bool}``

Any failure → ``{"ok": false, "error": class name, "status": HTTP status or gRPC code name or
null, "message": text}``.
"""
from __future__ import annotations

import asyncio
import base64
import importlib.metadata
import json
import os
import sys
import traceback
from typing import Any

# Run as a script, this file's directory comes first on sys.path, and tests/support/kserve.py
# (the harness) would shadow the kserve package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import grpc  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig  # noqa: E402
from kserve.protocol.infer_type import RequestedOutput  # noqa: E402

_rest: dict[str, InferenceRESTClient] = {}
_grpc: dict[str, InferenceGRPCClient] = {}


def _decode(doc: dict[str, Any]) -> np.ndarray:
    if "bytes" in doc:
        out = np.empty(len(doc["bytes"]), dtype=object)
        out[:] = [base64.b64decode(x) for x in doc["bytes"]]
        return out.reshape(doc["shape"])
    dtype = np.dtype(doc["dtype"])
    return np.frombuffer(base64.b64decode(doc["raw"]), dtype=dtype).astype(dtype.newbyteorder("="))\
        .reshape(doc["shape"])


def _encode(array: np.ndarray) -> dict[str, Any]:
    if array.dtype == object:
        items = [x if isinstance(x, bytes) else str(x).encode() for x in array.ravel().tolist()]
        return {"shape": list(array.shape), "bytes": [base64.b64encode(x).decode() for x in items]}
    little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
    return {"shape": list(array.shape), "dtype": little.dtype.str, "raw": base64.b64encode(little.tobytes()).decode()}


def _params(parameters: Any) -> dict[str, Any] | None:
    if parameters is None:
        return None
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if hasattr(value, "WhichOneof"):  # InferParameter from a gRPC answer
            kind = value.WhichOneof("parameter_choice")
            value = getattr(value, kind) if kind else None
        out[key] = value
    return out


def _rest_client(url: str, timeout: float) -> InferenceRESTClient:
    if url not in _rest:
        _rest[url] = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=timeout))
    return _rest[url]


def _grpc_client(url: str, timeout: float) -> InferenceGRPCClient:
    if url not in _grpc:
        _grpc[url] = InferenceGRPCClient(url, timeout=timeout, retries=0)
    return _grpc[url]


async def _infer(req: dict[str, Any]) -> dict[str, Any]:
    transport, url, timeout = req["transport"], req["url"], req.get("timeout", 60)
    inputs = []
    for spec in req["inputs"]:
        tensor = InferInput(spec["name"], spec["array"]["shape"], spec["datatype"],
                            parameters=dict(spec["parameters"]) if spec.get("parameters") else None)
        tensor.set_data_from_numpy(_decode(spec["array"]), binary_data=spec.get("binary", False))
        inputs.append(tensor)
    outputs = None
    if req.get("outputs") is not None:
        outputs = [RequestedOutput(o["name"], {"binary_data": True} if o.get("binary") else None)
                   for o in req["outputs"]]
    request = InferRequest(req["model"], inputs, request_id=req.get("id"),
                           parameters=req.get("parameters") or None, request_outputs=outputs)
    if transport == "rest":
        answer = await _rest_client(url, timeout).infer(f"http://{url}", request, model_name=req["model"])
    else:
        answer = await _grpc_client(url, timeout).infer(request)
    outs = []
    for out in answer.outputs:
        params = _params(out.parameters)
        # gRPC: kserve keeps raw_output_contents in _raw_data, typed contents in data. REST:
        # from_bytes turns binary outputs into data (and drops their binary_data_size): no form.
        form = ("raw" if out._raw_data is not None else "typed") if transport == "grpc" else None
        outs.append({"name": out.name, "datatype": out.datatype, "shape": list(out.shape),
                     "parameters": params, "form": form, "array": _encode(out.as_numpy())})
    return {"ok": True, "id": answer.id, "model_name": answer.model_name,
            "model_version": answer.model_version, "parameters": _params(answer.parameters),
            "outputs": outs}


async def _health(req: dict[str, Any]) -> dict[str, Any]:
    op, transport, url, timeout = req["op"], req["transport"], req["url"], req.get("timeout", 60)
    if transport == "rest":
        client = _rest_client(url, timeout)
        base = f"http://{url}"
        if op == "model_ready":
            value = await client.is_model_ready(base, req["model"])
        else:
            value = await getattr(client, f"is_{op}")(base)
    else:
        client = _grpc_client(url, timeout)
        if op == "model_ready":
            value = await client.is_model_ready(req["model"])
        else:
            value = await getattr(client, f"is_{op}")()
    return {"ok": True, "value": value}


async def handle(req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    try:
        if op == "ping":
            return {"ok": True, "kserve": importlib.metadata.version("kserve")}
        if op == "infer":
            return await _infer(req)
        if op in ("server_live", "server_ready", "model_ready"):
            return await _health(req)
        return {"ok": False, "error": "UnknownOp", "status": None, "message": f"unknown op {op!r}"}
    except httpx.HTTPStatusError as exc:
        return {"ok": False, "error": type(exc).__name__, "status": exc.response.status_code,
                "message": str(exc), "body": exc.response.text}
    except grpc.aio.AioRpcError as exc:
        return {"ok": False, "error": type(exc).__name__, "status": exc.code().name, "message": exc.details()}
    except Exception as exc:  # a client-side refusal or a parse failure: say which
        return {"ok": False, "error": type(exc).__name__, "status": None, "message": str(exc),
                "traceback": traceback.format_exc(limit=6)}


def main() -> None:
    loop = asyncio.new_event_loop()
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = loop.run_until_complete(handle(json.loads(line)))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    for client in [*_rest.values(), *_grpc.values()]:
        loop.run_until_complete(client.close())


if __name__ == "__main__":
    main()
