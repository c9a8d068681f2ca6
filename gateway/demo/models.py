"""The demo server's models: tiny numpy models with V2 metadata.

They mirror the real-Triton test models (``tests/models/triton/``: same names,
tensors, datatypes and shapes, served by Triton's Python backend with
``max_batch_size: 0``) so one set of test cases runs against both servers:

- ``add_sub``: INPUT0, INPUT1 FP32 ``[-1]`` → OUTPUT0 = sum, OUTPUT1 = difference.
- ``identity_<DT>`` for each V2 datatype: INPUT0 ``[-1, -1]`` → OUTPUT0, the
  raw bytes passed through untouched (so BF16 needs no numpy type).
- ``string_reverse``: INPUT0 BYTES ``[-1]`` → OUTPUT0, each element reversed.

Request checks follow Triton's order and wording (core ``src/infer_request.cc``
``Normalize``/``ValidateRequestInputs``, ``src/model.cc``): duplicate names,
unknown requested outputs, input count, then per input (in name order, as
Triton walks a ``std::map``) name, datatype and shape; byte sizes are checked
last by the codec's one validator. Version lookup follows
``GetModelVersionFromString`` (server ``src/common.cc``) and
``ModelLifeCycle::GetModel``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from ..codec.datatypes import DATATYPES, from_numpy, to_numpy, validate_tensor
from ..errors import InvalidRequest, ModelNotFound
from ..model import InferRequest, InferResponse, Tensor

__all__ = [
    "Model",
    "ModelRepository",
    "TensorSpec",
    "default_repository",
    "demo_models",
]

# A model's computation: validated inputs by name → every output, in the
# order of ``Model.outputs``. Raise InvalidRequest for bad values.
Compute = Callable[[Mapping[str, Tensor]], Sequence[Tensor]]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 marks a variable-size dimension

    def metadata(self) -> dict[str, Any]:
        """The spec's ``$metadata_tensor`` object."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _dims(shape: Sequence[int]) -> str:
    """A shape as Triton prints it (``DimsListToString``): ``[2,3]``, no spaces."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def _quoted(names: Iterable[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    compute: Compute
    # Triton reports a Python-backend model's backend as its platform
    # (TRITONSERVER_ServerModelMetadata); the demo says the same so metadata
    # compares equal across the two servers.
    platform: str = "python"
    version: str = "1"

    def metadata(self) -> dict[str, Any]:
        """The spec's ``$metadata_model_response``, keys in Triton's order."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": [s.metadata() for s in self.inputs],
            "outputs": [s.metadata() for s in self.outputs],
        }

    def infer(self, request: InferRequest) -> InferResponse:
        # Triton's request-validation messages start with this (InferenceRequest::LogRequest).
        prefix = f"[request id: {request.id or '<id_unknown>'}] "
        produced = self.compute(self._check(request, prefix))
        if request.outputs:
            # Triton returns the requested subset in the model's own output
            # order, whatever order the request named them in.
            wanted = {o.name for o in request.outputs}
            produced = [t for t in produced if t.name in wanted]
        return InferResponse(
            model_name=self.name, model_version=self.version, id=request.id, outputs=tuple(produced)
        )

    def _check(self, request: InferRequest, prefix: str) -> dict[str, Tensor]:
        given: dict[str, Tensor] = {}
        for t in request.inputs:
            if t.name in given:
                raise InvalidRequest(f"{prefix}input '{t.name}' already exists in request")
            given[t.name] = t
        requested: set[str] = set()
        for o in request.outputs:
            if o.name in requested:
                raise InvalidRequest(f"{prefix}output '{o.name}' already exists in request")
            requested.add(o.name)
        known_outputs = {s.name for s in self.outputs}
        for o in request.outputs:
            if o.name not in known_outputs:
                raise InvalidRequest(f"unexpected inference output '{o.name}' for model '{self.name}'")
        if len(given) != len(self.inputs):
            missing = [s.name for s in self.inputs if s.name not in given]
            raise InvalidRequest(
                f"{prefix}expected {len(self.inputs)} inputs but got {len(given)} inputs for model "
                f"'{self.name}'. Got input(s) {_quoted(sorted(given))}, but missing required "
                f"input(s) {_quoted(missing)}. Please provide all required input(s)."
            )
        specs = {s.name: s for s in self.inputs}
        for name in sorted(given):
            t, spec = given[name], specs.get(name)
            if spec is None:
                raise InvalidRequest(f"unexpected inference input '{name}' for model '{self.name}'")
            if t.datatype != spec.datatype:
                raise InvalidRequest(
                    f"{prefix}inference input '{name}' data-type is '{t.datatype}', but model "
                    f"'{self.name}' expects '{spec.datatype}'"
                )
            if any(d < 0 for d in t.shape):
                raise InvalidRequest(
                    f"{prefix}All input dimensions should be specified for input '{name}' for model "
                    f"'{self.name}', got {_dims(t.shape)}"
                )
            if len(t.shape) != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, t.shape)
            ):
                raise InvalidRequest(
                    f"{prefix}unexpected shape for input '{name}' for model '{self.name}'. "
                    f"Expected {_dims(spec.shape)}, got {_dims(t.shape)}."
                )
            # The codec has already checked sizes on the wire path; a Model is
            # also called directly (tests, other planes), so check again.
            validate_tensor(t)
        return given


# --- the models ------------------------------------------------------------


def _add_sub(inputs: Mapping[str, Tensor]) -> Sequence[Tensor]:
    t0, t1 = inputs["INPUT0"], inputs["INPUT1"]
    if t0.shape != t1.shape:
        # Worded as tests/models/triton/add_sub/1/model.py words it.
        raise InvalidRequest(f"INPUT0 shape {list(t0.shape)} != INPUT1 shape {list(t1.shape)}")
    a, b = to_numpy(t0), to_numpy(t1)  # '<f4' views of the request bytes, no copy
    return (from_numpy("OUTPUT0", a + b, "FP32"), from_numpy("OUTPUT1", a - b, "FP32"))


def _identity(inputs: Mapping[str, Tensor]) -> Sequence[Tensor]:
    # The validated input's bytes are already the output's raw form: no copy.
    t = inputs["INPUT0"]
    return (Tensor("OUTPUT0", t.datatype, t.shape, t.data),)


def _string_reverse(inputs: Mapping[str, Tensor]) -> Sequence[Tensor]:
    t = inputs["INPUT0"]
    # BYTES elements are Python objects by nature; one slice per element, no per-byte work.
    out = np.empty(t.shape, dtype=object)
    out.reshape(-1)[:] = [e[::-1] for e in to_numpy(t).reshape(-1).tolist()]
    return (from_numpy("OUTPUT0", out, "BYTES"),)


def demo_models() -> tuple[Model, ...]:
    """Every demo model: add_sub, identity_<DT> for each V2 datatype, string_reverse."""
    fp32 = (-1,)
    models = [
        Model(
            "add_sub",
            inputs=(TensorSpec("INPUT0", "FP32", fp32), TensorSpec("INPUT1", "FP32", fp32)),
            outputs=(TensorSpec("OUTPUT0", "FP32", fp32), TensorSpec("OUTPUT1", "FP32", fp32)),
            compute=_add_sub,
        )
    ]
    for dt in DATATYPES:
        models.append(
            Model(
                f"identity_{dt}",
                inputs=(TensorSpec("INPUT0", dt, (-1, -1)),),
                outputs=(TensorSpec("OUTPUT0", dt, (-1, -1)),),
                compute=_identity,
            )
        )
    models.append(
        Model(
            "string_reverse",
            inputs=(TensorSpec("INPUT0", "BYTES", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "BYTES", (-1,)),),
            compute=_string_reverse,
        )
    )
    return tuple(models)


# --- the repository ----------------------------------------------------------

# std::stol semantics: leading blanks, a sign, digits; anything after is ignored.
_STOL = re.compile(r"\s*([+-]?\d+)", re.ASCII)
_INT64 = range(-(2**63), 2**63)


def _parse_version(version: str) -> int:
    """Triton's GetModelVersionFromString: "" → -1 (latest); else a non-negative integer."""
    if version == "":
        return -1
    m = _STOL.match(version)
    if m is None or int(m[1]) not in _INT64:
        raise InvalidRequest(
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
        )
    n = int(m[1])
    if n < 0:
        raise InvalidRequest(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return n


class ModelRepository(Mapping[str, Model]):
    """A read-only mapping of model name → Model, with V2 version lookup."""

    __slots__ = ("_models",)

    def __init__(self, models: Iterable[Model]) -> None:
        table: dict[str, Model] = {}
        for m in models:
            if m.name in table:
                raise ValueError(f"duplicate model name {m.name!r}")
            table[m.name] = m
        self._models = MappingProxyType(table)

    def __getitem__(self, name: str) -> Model:
        return self._models[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def resolve(self, name: str, version: str = "") -> Model:
        """The model serving ``name`` at ``version`` ("" = latest), or raise.

        Raises InvalidRequest for a version string Triton cannot parse and
        ModelNotFound for an unknown model or version, in Triton's words.
        """
        n = _parse_version(version)
        model = self._models.get(name)
        if model is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        if n != -1 and str(n) != model.version:
            raise ModelNotFound(f"Request for unknown model: '{name}' version {n} is not found")
        return model

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.resolve(name, version)
        except (InvalidRequest, ModelNotFound):
            return False
        return True

    def metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self.resolve(name, version).metadata()

    def infer(self, request: InferRequest) -> InferResponse:
        return self.resolve(request.model_name, request.model_version).infer(request)


def default_repository() -> ModelRepository:
    return ModelRepository(demo_models())
