"""Custom MLServer runtimes mirroring the Triton test models in tests/models/triton/.

Each model folder holds a model-settings.json whose "implementation" names a class here;
MLServer puts the repository root on sys.path, so this module imports as
``oip_test_runtimes``. The module runs inside MLServer's own virtual environment
(.mlserver-venv), never in the project's venv.

- add_sub:        OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, shape [-1]).
- identity_<DT>:  OUTPUT0 is INPUT0 (same datatype, same shape, including 0-sized dims).
- string_reverse: each element of INPUT0 (BYTES, shape [-1]) with its bytes reversed.

Numeric tensors are decoded with NumpyCodec, so the array has the exact numpy dtype of the
declared datatype, and encoded back with NumpyCodec (keeping that datatype). NumpyCodec
pads 1-D shapes to [N, 1] ("batch dimension") on output, so the input's shape is restored.
BYTES tensors are read raw: over gRPC the elements arrive as ``bytes``, over REST JSON as
``str`` (MLServer has no binary-data extension); NumpyCodec's BYTES path assumes fixed-size
elements, so it is not used for them.

Like Triton, a request that names outputs gets only those outputs; an input with a wrong
name or datatype is rejected with MLServer's InferenceError (HTTP 400 / gRPC INVALID_ARGUMENT).
"""
from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import Base64Codec, NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput


def _declared(model: MLModel) -> dict[str, str]:
    return {t.name: getattr(t.datatype, "value", t.datatype) for t in model.settings.inputs}


def _inputs(model: MLModel, payload: InferenceRequest) -> dict[str, RequestInput]:
    declared = _declared(model)
    got: dict[str, RequestInput] = {}
    for inp in payload.inputs:
        if inp.name not in declared:
            raise InferenceError(f"unexpected input '{inp.name}' for model '{model.name}'")
        if inp.datatype != declared[inp.name]:
            raise InferenceError(
                f"input '{inp.name}' of model '{model.name}' has datatype {inp.datatype}, "
                f"expected {declared[inp.name]}"
            )
        if inp.name in got:
            raise InferenceError(f"input '{inp.name}' given twice")
        got[inp.name] = inp
    missing = [name for name in declared if name not in got]
    if missing:
        raise InferenceError(f"model '{model.name}' is missing input(s) {missing}")
    return got


def _numpy(inp: RequestInput) -> np.ndarray:
    try:
        return NumpyCodec.decode_input(inp)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InferenceError(f"input '{inp.name}': cannot decode {inp.datatype} {inp.shape}: {exc}") from exc


def _encode_numpy(name: str, array: np.ndarray) -> ResponseOutput:
    out = NumpyCodec.encode_output(name, array)
    out.shape = list(array.shape)  # undo NumpyCodec's [N] -> [N, 1]
    return out


def _bytes_elements(inp: RequestInput) -> list[bytes]:
    data = inp.data.root if hasattr(inp.data, "root") else inp.data
    if isinstance(data, (bytes, str)):
        data = [data]
    values = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in data]
    count = int(np.prod(inp.shape)) if inp.shape else 1
    if len(values) != count:
        raise InferenceError(f"input '{inp.name}': shape {inp.shape} needs {count} elements, got {len(values)}")
    return values


def _encode_bytes(name: str, values: list[bytes], shape: list[int]) -> ResponseOutput:
    return ResponseOutput(name=name, datatype="BYTES", shape=list(shape), data=values)


class _Base(MLModel):
    async def load(self) -> bool:
        return True

    def _respond(self, payload: InferenceRequest, outputs: list[ResponseOutput]) -> InferenceResponse:
        if payload.outputs:
            by_name = {o.name: o for o in outputs}
            wanted = []
            for req in payload.outputs:
                if req.name not in by_name:
                    raise InferenceError(f"unknown output '{req.name}' for model '{self.name}'")
                wanted.append(by_name[req.name])
            outputs = wanted
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)


class AddSub(_Base):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = _inputs(self, payload)
        a = _numpy(inputs["INPUT0"])
        b = _numpy(inputs["INPUT1"])
        if a.shape != b.shape:
            raise InferenceError(f"INPUT0 shape {list(a.shape)} != INPUT1 shape {list(b.shape)}")
        return self._respond(
            payload,
            [
                _encode_numpy("OUTPUT0", (a + b).astype(np.float32)),
                _encode_numpy("OUTPUT1", (a - b).astype(np.float32)),
            ],
        )


class Identity(_Base):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inp = _inputs(self, payload)["INPUT0"]
        if inp.datatype == "BYTES":
            out = _encode_bytes("OUTPUT0", _bytes_elements(inp), inp.shape)
        else:
            out = _encode_numpy("OUTPUT0", _numpy(inp))
        return self._respond(payload, [out])


class StringReverse(_Base):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inp = _inputs(self, payload)["INPUT0"]
        values = [v[::-1] for v in _bytes_elements(inp)]
        return self._respond(payload, [_encode_bytes("OUTPUT0", values, inp.shape)])


class BytesHex(_Base):
    """Each BYTES element's bytes as hex text: shows what bytes the model received, decoding
    its input as MLServer's codecs do (a ``base64`` content type is decoded; gRPC bytes and
    JSON strings are taken as they are) — and answers text, which travels in any form."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inp = _inputs(self, payload)["INPUT0"]
        content_type = inp.parameters.content_type if inp.parameters is not None else None
        values = Base64Codec.decode_input(inp) if content_type == "base64" else _bytes_elements(inp)
        hexes = [bytes(v).hex().encode("ascii") for v in values]
        return self._respond(payload, [_encode_bytes("OUTPUT0", hexes, [len(hexes)])])


__all__ = ["AddSub", "BytesHex", "Identity", "StringReverse"]
