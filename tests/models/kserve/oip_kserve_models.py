"""V2 models for KServe's ModelServer in the test suite (tests/support/kserve.py).

Each is a ``kserve.Model`` answering the way KServe's own servers do (``kserve.utils.utils.
get_predict_response``): outputs are written with ``set_data_from_numpy(...,
binary_data=payload.use_binary_outputs)`` and the response carries ``use_binary_outputs`` and
``requested_outputs``, so a raw gRPC request is answered raw and a typed one typed, and a REST
client's ``binary_data_output`` / per-output ``binary_data`` are honoured.

- ``identity_<DATATYPE>`` for every datatype KServe supports (BOOL, UINT8…UINT64, INT8…INT64,
  FP16, FP32, FP64, BYTES; no BF16): ``INPUT0`` [-1, -1] → ``OUTPUT0``, unchanged.
- ``add_sub``: FP32 ``INPUT0``, ``INPUT1`` → ``OUTPUT0`` = sum, ``OUTPUT1`` = difference (as
  Triton's demo model).
- ``echo_params``: ``INPUT0`` (any datatype) → ``OUTPUT0`` unchanged; the request's parameters
  come back as the response's parameters and ``INPUT0``'s parameters as ``OUTPUT0``'s.
- ``fail``: raises ``InvalidInput`` (KServe: 400 / INVALID_ARGUMENT with the message).
- ``crash``: raises ``RuntimeError`` (KServe: 500 with the message / INTERNAL
  "Internal server error").

Imported only inside .kserve-venv (by serve.py next to this file).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model
from kserve.errors import InvalidInput
from kserve.utils.utils import generate_uuid

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]

# Parameters the binary-data extension puts on tensors: transport, not the model's business.
_TRANSPORT_PARAMETERS = {"binary_data_size", "binary_data"}


def _plain(parameters: Any) -> dict[str, Any]:
    """Request parameters (a dict over REST, a protobuf map over gRPC) as a plain dict."""
    if not parameters:
        return {}
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if hasattr(value, "WhichOneof"):  # InferParameter
            kind = value.WhichOneof("parameter_choice")
            if kind is None:
                continue
            value = getattr(value, kind)
        if key not in _TRANSPORT_PARAMETERS:
            out[key] = value
    return out


def _output(payload: InferRequest, name: str, array: np.ndarray, datatype: str,
            parameters: dict[str, Any] | None = None) -> InferOutput:
    out = InferOutput(name=name, shape=list(array.shape), datatype=datatype, parameters=parameters or None)
    out.set_data_from_numpy(array, binary_data=payload.use_binary_outputs)
    return out


def _response(model: Model, payload: InferRequest, outputs: list[InferOutput],
              parameters: dict[str, Any] | None = None) -> InferResponse:
    return InferResponse(
        # As KServe's own servers (get_predict_response): a request without an id gets a fresh
        # one, since KServe's REST side refuses to send a response whose id is null (500).
        response_id=payload.id if payload.id else generate_uuid(),
        model_name=model.name,
        infer_outputs=outputs,
        parameters=parameters or None,
        use_binary_outputs=payload.use_binary_outputs,
        requested_outputs=payload.request_outputs,
    )


class _Base(Model):
    inputs: list[dict] = []
    outputs: list[dict] = []

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.load()

    def get_input_types(self) -> list[dict]:
        return self.inputs

    def get_output_types(self) -> list[dict]:
        return self.outputs

    def _input(self, payload: InferRequest, name: str) -> np.ndarray:
        found = payload.get_input_by_name(name)
        if found is None:
            raise InvalidInput(f"model '{self.name}' expects an input named '{name}'")
        return found.as_numpy()


class Identity(_Base):
    def __init__(self, datatype: str) -> None:
        self.datatype = datatype
        self.inputs = [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
        self.outputs = [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, -1]}]
        super().__init__(f"identity_{datatype}")

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        tensor = payload.inputs[0]
        if tensor.datatype != self.datatype:
            raise InvalidInput(f"model '{self.name}' expects {self.datatype}, got {tensor.datatype}")
        array = tensor.as_numpy()
        return _response(self, payload, [_output(payload, "OUTPUT0", array, self.datatype)])


class AddSub(_Base):
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]},
              {"name": "INPUT1", "datatype": "FP32", "shape": [-1]}]
    outputs = [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]},
               {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1]}]

    def __init__(self) -> None:
        super().__init__("add_sub")

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        a = self._input(payload, "INPUT0").astype(np.float32)
        b = self._input(payload, "INPUT1").astype(np.float32)
        if a.shape != b.shape:
            raise InvalidInput(f"INPUT0 {list(a.shape)} and INPUT1 {list(b.shape)} differ in shape")
        return _response(self, payload, [_output(payload, "OUTPUT0", a + b, "FP32"),
                                          _output(payload, "OUTPUT1", a - b, "FP32")])


class EchoParams(_Base):
    inputs = [{"name": "INPUT0", "datatype": "INT32", "shape": [-1]}]
    outputs = [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1]}]

    def __init__(self) -> None:
        super().__init__("echo_params")

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        tensor = payload.inputs[0]
        out = _output(payload, "OUTPUT0", tensor.as_numpy(), tensor.datatype, _plain(tensor.parameters))
        return _response(self, payload, [out], _plain(payload.parameters))


class Fail(_Base):
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]

    def __init__(self) -> None:
        super().__init__("fail")

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        raise InvalidInput("fail: this model refuses every request")


class Crash(_Base):
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]

    def __init__(self) -> None:
        super().__init__("crash")

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        raise RuntimeError("crash: the model broke")


def all_models() -> list[Model]:
    return [*(Identity(dt) for dt in DATATYPES), AddSub(), EchoParams(), Fail(), Crash()]


def model_names() -> list[str]:
    return [f"identity_{dt}" for dt in DATATYPES] + ["add_sub", "echo_params", "fail", "crash"]
