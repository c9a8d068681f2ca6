"""Our copies of Triton's extension messages are Triton's, field for field.

The gateway converts model configuration, statistics, model control parameters and
trace/log settings between HTTP JSON and gRPC bytes by these descriptors: a field that
differs in name, number, type or label would change a value on the way. Compared with
the descriptors tritonclient ships (generated from Triton's own .proto files)."""
from __future__ import annotations

from typing import Any

import pytest

from gateway._pb import model_config_pb2, triton_extensions_pb2

tc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import model_config_pb2 as tc_model_config  # noqa: E402
from tritonclient.grpc import service_pb2 as tc_service  # noqa: E402


def shape(d: Any, seen: set[str] | None = None) -> Any:
    """A message descriptor as plain data: fields (name, number, type, repeated, oneof,
    referenced type) and, recursively, the types it refers to."""
    seen = set() if seen is None else seen
    if d.full_name in seen:
        return d.full_name
    seen.add(d.full_name)
    fields = []
    for f in d.fields:
        ref = None
        if f.message_type is not None:
            ref = shape(f.message_type, seen)
        elif f.enum_type is not None:
            ref = (f.enum_type.full_name, [(v.name, v.number) for v in f.enum_type.values])
        fields.append((f.name, f.number, f.type, f.is_repeated, f.containing_oneof.name if f.containing_oneof else None,
                       ref))
    return (d.full_name, sorted(fields, key=lambda x: x[1]))


def test_model_config_matches_tritons() -> None:
    names = set(tc_model_config.DESCRIPTOR.message_types_by_name)
    assert names == set(model_config_pb2.DESCRIPTOR.message_types_by_name)
    for name in sorted(names):
        assert shape(model_config_pb2.DESCRIPTOR.message_types_by_name[name]) == \
            shape(tc_model_config.DESCRIPTOR.message_types_by_name[name]), name


@pytest.mark.parametrize("name", sorted(triton_extensions_pb2.DESCRIPTOR.message_types_by_name))
def test_extension_message_matches_tritons(name: str) -> None:
    assert shape(triton_extensions_pb2.DESCRIPTOR.message_types_by_name[name]) == \
        shape(tc_service.DESCRIPTOR.message_types_by_name[name])
