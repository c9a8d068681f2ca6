"""Regenerate gateway/_pb from proto/grpc_predict_v2.proto.

Run from the repository root: ``python scripts/gen_proto.py``. The generated
modules are committed so that installing the package needs no protoc; this
script (grpcio-tools, pinned in the ``dev`` extra) reproduces them exactly.
"""
from __future__ import annotations

import pathlib
import re
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "gateway" / "_pb"


def main() -> int:
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={OUT}",
        f"--grpc_python_out={OUT}",
        f"--pyi_out={OUT}",
        str(ROOT / "proto" / "grpc_predict_v2.proto"),
    ])
    if rc != 0:
        return rc
    # protoc writes an absolute import; make it package-relative.
    grpc_mod = OUT / "grpc_predict_v2_pb2_grpc.py"
    text = grpc_mod.read_text()
    text = re.sub(r"^import grpc_predict_v2_pb2 as", "from . import grpc_predict_v2_pb2 as", text, flags=re.M)
    grpc_mod.write_text(text)
    # Register our messages in a private descriptor pool, not protobuf's global
    # one: tritonclient.grpc registers the same 'inference.*' names from Triton's
    # grpc_service.proto, and two files defining one symbol in one pool is an
    # error. The gateway never needs to share descriptors with anyone.
    pb_mod = OUT / "grpc_predict_v2_pb2.py"
    text = pb_mod.read_text()
    text = text.replace(
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
        "POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = POOL.AddSerializedFile(",
    )
    pb_mod.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
