"""Triton's extension messages between its HTTP JSON and its gRPC protobuf. No I/O.

Triton answers HTTP ``/config`` and ``/stats`` with the JSON mapping of the protobuf
messages its gRPC ``ModelConfig`` / ``ModelStatistics`` RPCs answer (model_config.proto,
grpc_service.proto): the proto's own field names, every field printed (defaults
included; an unset sub-message left out), enums by name, map keys as strings — and,
unlike protobuf's canonical mapping, 64-bit integers as JSON *numbers* (Triton rewrites
the strings protobuf prints: model_config_utils.cc ``ModelConfigToJson``, all but three
fields; the statistics JSON is written by hand with numbers). Checked against the Triton
in nvidia-pytriton: the JSON built here equals Triton's own, key for key and value for
value (tests/integration/test_triton_extensions.py).

Never a changed value: a message with fields this gateway does not know (a newer
Triton) is refused with their numbers, never passed on without them; a JSON document
with a key the message has not is refused naming it.

The work is split by job: ``tritonjson`` (the mapping itself, and the model configuration),
``tritonstats`` (statistics, and their sum over endpoints) and ``tritoncontrol`` (model
load / unload, trace and log settings, model versions). Their public names are re-exported
here, where the rest of the gateway imports them.
"""
from __future__ import annotations

from .tritoncontrol import (
    control_from_json,
    control_to_json,
    log_to_json,
    log_to_pb,
    trace_to_json,
    trace_to_pb,
    version_refusal,
)
from .tritonjson import config_from_json, config_to_json, message_from_json, message_to_json, parse_message
from .tritonstats import stats_from_json, stats_from_pb, stats_sum, stats_to_json, stats_to_pb

__all__ = [
    "config_from_json",
    "config_to_json",
    "control_from_json",
    "control_to_json",
    "log_to_json",
    "log_to_pb",
    "message_from_json",
    "message_to_json",
    "parse_message",
    "stats_from_json",
    "stats_from_pb",
    "stats_sum",
    "stats_to_json",
    "stats_to_pb",
    "trace_to_json",
    "trace_to_pb",
    "version_refusal",
]
