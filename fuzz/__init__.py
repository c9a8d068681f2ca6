"""Coverage-guided fuzz harnesses (docs/fuzzing.md).

One module per target, each with ``one_input(data: bytes)``: the function atheris
(libFuzzer) calls, and the one the bounded run in the test suite calls. Run one as
``python -m fuzz.<target> [libFuzzer flags] [corpus dirs]``. The contract every harness
checks: only the gateway's own errors (:class:`gateway.errors.GatewayError`, or
:class:`gateway.errors.ConfigError` from the config loader; the backend HTTP/1.1 client's
``BadAnswer`` / ``ConnectionDropped``, and the gRPC client's ``CallError``, as outcomes) may
escape, and where a second implementation exists (protobuf's parser, Python's json module, the
encoder of the other protocol, h11, the ``h2`` package) its answer must agree; anything else
raises :class:`FuzzBug` or escapes as the foreign exception it is, which libFuzzer reports as a
crash.

This package imports nothing from ``gateway`` itself, so that a harness run under
atheris imports (and instruments) the gateway's modules first.
"""

__all__ = ["NEEDS_H2", "TARGETS"]

# Target name (module fuzz.<name>, seed corpus fuzz/corpus/<name>/, dictionary fuzz/dicts/<name>.dict).
TARGETS = ("http_body", "grpc_wire", "config", "h1_answer", "h2_listen", "h2_answer")
# Targets on the HTTP/2 extension (gateway.h2._h2): nothing to fuzz where it is not built.
NEEDS_H2 = ("h2_listen", "h2_answer")
