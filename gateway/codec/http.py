"""JSON inference bodies and the HTTP binary-data extension ↔ the neutral model.

Request and response bodies are the spec's "Inference Request/Response JSON
Object" (open-inference-protocol.txt, HTTP/REST "Inference"), optionally
followed by a binary section: the body starts with ``Inference-Header-Content-Length``
bytes of JSON, then the raw bytes of every tensor that carries
``parameters.binary_data_size``, in tensor order (ovms-kserve-rest-api-binary-extension.txt;
Triton's http_server.cc, which tritonclient matches). Binary slices stay
memoryviews of the body; JSON ``data`` is converted by numpy in one call.

The caller owns the HTTP headers. ``header_length`` in and out is the
``Inference-Header-Content-Length`` value: ``None`` means "the whole body is
JSON" (send ``Content-Type: application/json``); an int means "send
``application/octet-stream`` and this header", as Triton does. The body is
read by that length, never by content type: OVMS answers ``application/json``
with a binary section.

``binary_data`` (requested outputs) and ``binary_data_output`` (request) stay in
the decoded parameters: the front end passes the decoded request to
:func:`binary_policy` to choose the response form. :func:`encode_request` adds
``binary_data: true`` where they are absent (the gateway wants raw bytes back),
and ``grpc.encode_request`` drops them. Only ``binary_data_size`` is stripped on
decode, since it describes this one body.

Decoders validate everything once (datatypes, shapes, sizes; errors name the
tensor); encoders trust their tensors, which came from a decoder or ``from_numpy``.

The work is split by job: ``httpdecode`` (bodies → the model, and :func:`binary_policy`),
``httpencode`` (the model → body chunks) and ``jsondata`` (a tensor's JSON ``data`` ↔ raw
bytes). Their public names are re-exported here, where the rest of the gateway imports them.
"""
from __future__ import annotations

from .httpdecode import binary_policy, decode_request, decode_response
from .httpencode import encode_request, encode_response

__all__ = ["binary_policy", "decode_request", "decode_response", "encode_request", "encode_response"]
