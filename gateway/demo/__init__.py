"""The embedded reference V2 server of ``oip-gateway demo``.

The gateway's own HTTP and gRPC front ends serve a ``plane.DemoPlane``, a
:class:`gateway.dataplane.DataPlane` that runs local numpy models
(``models``) instead of proxying, so the demo speaks the protocol exactly as
the gateway does. ``DemoPlane`` is not re-exported: importing it loads the
generated protobuf module, and keeping this package light lets the models be
imported next to tritonclient.grpc (both register ``inference.*`` protos).
"""
from .models import Model, ModelRepository, TensorSpec, default_repository, demo_models

__all__ = ["Model", "ModelRepository", "TensorSpec", "default_repository", "demo_models"]
