"""The hard limits on a request's names, shapes, tensor counts and ids (config ``limits``): one
function each, called on every inference (a model's name and version by both front ends, the rest
by codec/limits.py and codec/grpcscan.py). Compiled with mypyc (setup.py): each is a few
comparisons, and an interpreted call costs more than its body. No I/O.

Each refusal is a LimitExceeded (400 / INVALID_ARGUMENT) naming the limit's key. The
shape product is computed with an early stop, so a shape whose product overflows 64
bits is refused as "too many elements", never wrapped around.
"""
from __future__ import annotations

from ..config.security import Limits
from ..errors import LimitExceeded, NegativeDimension

__all__ = ["check_names", "limit_count", "limit_id", "limit_name", "limit_shape"]


def _shown(name: object) -> str:
    text = str(name)
    return repr(text if len(text) <= 64 else text[:64] + "…")


def check_names(model: str, version: str, limits: Limits) -> None:
    if len(model) > limits.max_name_length:
        raise LimitExceeded(f"model name of {len(model)} characters is over limits.max_name_length "
                            f"({limits.max_name_length})")
    if len(version) > limits.max_name_length:
        raise LimitExceeded(f"model version of {len(version)} characters is over limits.max_name_length "
                            f"({limits.max_name_length})")


# _NONZERO: max_elements bounds the product of a shape's dimensions other than 0. A shape with
# a 0 holds no elements, but backends size buffers from the other dimensions: [0, 2**63-1] FP32
# passes Triton 2.51's own checks and kills its Python backend's stub (numpy: "array is too big"),
# taking the model down for every client. So [0, 2**40] is refused like [2**40].
def limit_shape(name: object, dims: list[int], limits: Limits) -> None:
    if len(dims) > limits.max_dims:
        raise LimitExceeded(f"tensor {_shown(name)} has {len(dims)} dimensions, over limits.max_dims "
                            f"({limits.max_dims})")
    elements = 1
    for d in dims:
        if d < 0:
            # Not a size (spec "Inference Request JSON Object": shape is the tensor's size);
            # refused here, on every path: Triton 2.51's HTTP side answers it with a 500.
            raise NegativeDimension(f"tensor {_shown(name)}: shape {dims[:8]}{'…' if len(dims) > 8 else ''} has a "
                                    "negative dimension")
        if d == 0:
            continue  # (see _NONZERO)
        elements *= d
        if elements > limits.max_elements:
            zero = " (its dimensions other than 0)" if 0 in dims else ""
            raise LimitExceeded(f"tensor {_shown(name)} has a shape{zero} of more than {limits.max_elements} "
                                f"elements (limits.max_elements): {dims[:8]}{'…' if len(dims) > 8 else ''}")


def limit_count(what: str, n: int, limits: Limits) -> None:
    if n > limits.max_tensors:
        raise LimitExceeded(f"request has {n} {what} tensors, over limits.max_tensors ({limits.max_tensors})")


def _characters(text: str | bytes | memoryview) -> int:
    """A name's length in characters, as the parsed message's string has them; a name read from
    the wire (UTF-8 bytes) is decoded only when its bytes are over the limit (rare)."""
    return len(text) if isinstance(text, str) else len(bytes(text).decode("utf-8", "replace"))


def limit_name(name: object, limits: Limits) -> None:
    if isinstance(name, (str, bytes, memoryview)) and len(name) > limits.max_name_length:
        n = _characters(name)
        if n > limits.max_name_length:
            raise LimitExceeded(f"tensor name of {n} characters is over limits.max_name_length "
                                f"({limits.max_name_length})")


def limit_id(what: str, value: object, limits: Limits) -> None:
    if isinstance(value, (str, bytes, memoryview)) and len(value) > limits.max_id_length:
        n = _characters(value)
        if n > limits.max_id_length:
            raise LimitExceeded(f"{what} of {n} characters is over limits.max_id_length "
                                f"({limits.max_id_length})")
