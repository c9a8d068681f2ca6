"""The embedded reference V2 server of ``oip-gateway demo``.

The gateway's own HTTP and gRPC front ends serve a :class:`DemoPlane`, a
:class:`gateway.dataplane.DataPlane` that runs local numpy models instead of
proxying, so the demo speaks the protocol exactly as the gateway does.
"""
from .models import Model, ModelRepository, TensorSpec, default_repository, demo_models

__all__ = ["Model", "ModelRepository", "TensorSpec", "default_repository", "demo_models"]
