"""The transport-neutral inference request and response.

A request decoded from any wire form (JSON, the HTTP binary-data extension,
gRPC) becomes an :class:`InferRequest`; a backend's answer becomes an
:class:`InferResponse`. Tensor bytes are always the *raw* form of the spec
("Tensor Data": flattened, row-major, little-endian; BYTES elements each
prefixed by a 4-byte little-endian length, as in the binary extension and
``raw_input_contents``). They stay ``memoryview`` slices of the received
buffer wherever the wire form allows it, so converting between transports
copies tensor bytes at most once.

``model_version == ""`` means "no version requested". Parameter dicts are
never mutated after construction.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

__all__ = ["InferRequest", "InferResponse", "Params", "RequestedOutput", "Scalar", "Tensor"]

Scalar = Union[str, int, float, bool]
Params = dict[str, Scalar]


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: memoryview
    parameters: Params = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    parameters: Params = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: Params = field(default_factory=dict)
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[RequestedOutput, ...] = ()


@dataclass(frozen=True, slots=True)
class InferResponse:
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: Params = field(default_factory=dict)
    outputs: tuple[Tensor, ...] = ()
