"""What the first-generation bridge knows of a model (codec/v1.py): its tensors and batching,
read from Triton's model configuration or the V2 metadata, and the datatype spellings."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from .._pb import legacy_v1_pb2 as v1
from .._pb import model_config_pb2 as mc
from .._pb import triton_extensions_pb2 as tx
from ..errors import BadUpstreamResponse
from .datatypes import DATATYPES

__all__ = ["ModelInfo", "TensorInfo", "model_info"]

# V2 datatype ↔ v1 DataType (proto/legacy_v1.proto). BF16 came after the first generation.
_TO_V1 = {name: getattr(v1, f"TYPE_{'STRING' if name == 'BYTES' else name}") for name in DATATYPES if name != "BF16"}
# Triton's model configuration spells datatypes as its own DataType enum (TYPE_FP32, TYPE_STRING…).
_FROM_TRITON = {"TYPE_STRING": "BYTES", **{f"TYPE_{n}": n for n in DATATYPES if n != "BYTES"}}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str  # V2 spelling; "" when unknown
    dims: tuple[int, ...]  # without the batch dimension of a batching model; -1: any
    label_filename: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the bridge must know of a model: batching (Triton's ``max_batch_size``: > 0 means
    the first dimension is the batch) and its tensors. ``from_config`` is False when only the
    V2 metadata was available (then the model is taken as not batching)."""

    name: str
    platform: str
    max_batch_size: int
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    from_config: bool = True


def model_info(config: bytes | None, metadata: Mapping[str, Any] | None, model: str) -> ModelInfo:
    """From a serialized Triton ModelConfigResponse when there is one, else from V2 metadata."""
    if config is not None:
        try:
            c = tx.ModelConfigResponse.FromString(config).config
        except DecodeError as exc:
            raise BadUpstreamResponse(f"model '{model}': unreadable model configuration: {exc}") from exc

        def tensor(t: Any, label: str = "") -> TensorInfo:
            return TensorInfo(t.name, _FROM_TRITON.get(mc.DataType.Name(t.data_type), ""), tuple(t.dims), label)

        return ModelInfo(c.name or model, c.platform or c.backend, c.max_batch_size,
                         {t.name: tensor(t) for t in c.input},
                         {t.name: tensor(t, t.label_filename) for t in c.output})
    meta = metadata or {}

    def from_meta(items: Any) -> dict[str, TensorInfo]:
        out = {}
        for t in items or ():
            name = str(t.get("name", ""))
            out[name] = TensorInfo(name, str(t.get("datatype", "")), tuple(int(d) for d in t.get("shape", ())))
        return out

    return ModelInfo(str(meta.get("name") or model), str(meta.get("platform") or ""), 0,
                     from_meta(meta.get("inputs")), from_meta(meta.get("outputs")), from_config=False)
