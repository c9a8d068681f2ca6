"""Regenerate gateway/_pb from proto/*.proto.

Run from the repository root: ``python scripts/gen_proto.py``. The generated
modules are committed so that installing the package needs no protoc; this
script (grpcio-tools, pinned in the ``dev`` extra) reproduces them exactly.

- grpc_predict_v2.proto: the V2 service (spec "GRPC").
- model_config.proto, triton_extensions.proto: Triton's own messages the gateway
  converts between HTTP JSON and gRPC (model configuration, statistics, model
  control parameters, trace and log settings).
- legacy_v1.proto: the first-generation API's messages and its GRPCService, which the
  gateway answers by translating to V2 (gateway/codec/v1.py, docs/v1-bridge.md).
"""
from __future__ import annotations

import pathlib
import re
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "gateway" / "_pb"
FILES = ("grpc_predict_v2", "model_config", "triton_extensions", "legacy_v1")
# Files that declare a service: their _pb2_grpc modules are kept.
SERVICES = ("grpc_predict_v2", "legacy_v1")


def main() -> int:
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={OUT}",
        f"--grpc_python_out={OUT}",
        f"--pyi_out={OUT}",
        *(str(ROOT / "proto" / f"{name}.proto") for name in FILES),
    ])
    if rc != 0:
        return rc
    for name in FILES:
        # protoc writes absolute imports; make them package-relative.
        for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"):
            mod = OUT / f"{name}{suffix}"
            if not mod.exists():
                continue
            text = mod.read_text()
            text = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", text, flags=re.M)
            mod.write_text(text)
        # Register our messages in a private descriptor pool, not protobuf's global
        # one: tritonclient.grpc registers the same 'inference.*' names from Triton's
        # protos, and two files defining one symbol in one pool is an error. All our
        # files share grpc_predict_v2's pool (triton_extensions imports model_config).
        pb_mod = OUT / f"{name}_pb2.py"
        text = pb_mod.read_text()
        if name == "grpc_predict_v2":
            new = "POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = POOL.AddSerializedFile("
        else:
            new = "from .grpc_predict_v2_pb2 import POOL\nDESCRIPTOR = POOL.AddSerializedFile("
        text = text.replace("DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(", new)
        pb_mod.write_text(text)
    # The other files' (empty) grpc modules are not kept.
    for name in (n for n in FILES if n not in SERVICES):
        (OUT / f"{name}_pb2_grpc.py").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
