"""oip-gateway: a stateless front door for Open Inference Protocol (KServe V2) servers."""
from .grpcengine import choose_grpc_engine

# Before any module of the gateway imports grpc: grpc reads its engine choice once, at import
# (grpcengine.py says why it is made).
choose_grpc_engine()

__version__ = "0.1.0"
__all__ = ["__version__"]
