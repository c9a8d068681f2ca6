"""Generated protobuf/gRPC modules; regenerate with ``python scripts/gen_proto.py``."""
