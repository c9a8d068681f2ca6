"""The pure codec: wire forms of the Open Inference Protocol ↔ :mod:`gateway.model`.

No I/O and no transport imports (DESIGN.md "Layout"): ``datatypes`` (the
datatype table and the one tensor validator), ``http`` (JSON and the HTTP
binary-data extension), ``grpc`` (ModelInfer messages with raw contents as
memoryview slices) and ``wire`` (protobuf field scanning). Import the
submodules; nothing is re-exported here so ``import gateway.codec.wire``
stays as cheap as it is.
"""

__all__ = ["datatypes", "grpc", "http", "wire"]
