"""The first-generation inference server API ("v1") translated to V2 and back. No I/O.

Spec: ../shared/spec/legacy-v1-inference-server-api.txt ("the API text") and
legacy-v1-infer-request-header.proto.txt ("the header text"); messages in
proto/legacy_v1.proto. The front ends (frontend/v1_http.py, frontend/v1_grpc.py) fetch
what is needed from the data plane and call these functions:

- ``parse_header_text``: the ``NV-InferRequest`` header (text format) → InferRequestHeader.
- ``model_info``: a model's tensors and batching, from Triton's model configuration (V2
  ``ModelConfig``) or, for a backend without one, from the V2 model metadata.
- ``plan_inputs`` / ``split_body`` / ``build_request``: the v1 request as a V2
  ModelInferRequest (batch rules, byte sizes, sequence flags, priority, timeout).
- ``finish``: the V2 answer as an InferResponseHeader plus raw outputs (top-K classes
  computed here).
- ``server_status``, ``request_status``: status answers and the RequestStatus of an error.

Never a changed value: what cannot be expressed in the other form (a BF16 tensor, a
classification value a float cannot hold, a version that is not a number) is refused by name.

The translation is split by job: ``v1model`` (a model's tensors and batching),
``v1request`` (the v1 request → V2) and ``v1answer`` (V2 answers, status and errors → v1).
Their public names are re-exported here, where the front ends import them.
"""
from __future__ import annotations

from .v1answer import finish, request_status, server_status, status_text
from .v1model import ModelInfo, TensorInfo, model_info
from .v1request import InputPlan, Plan, build_request, parse_header_text, plan_inputs, split_body, v1_version

__all__ = ["InputPlan", "ModelInfo", "Plan", "TensorInfo", "build_request", "finish", "model_info", "parse_header_text",
           "plan_inputs", "request_status", "server_status", "split_body", "status_text", "v1_version"]
