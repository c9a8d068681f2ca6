"""Fuzz target: HTTP inference bodies on the converting path, and the JSON depth check.

Input layout (so one byte string covers every body shape the front end accepts):

- byte 0, flags: bits 0-1 the body's shape — 0 all JSON (no Inference-Header-Content-Length);
  1 JSON header, a NUL, the binary section (the header length is the header's, the NUL
  dropped); 2 the header length read from bytes 2-3 (any value, in range or not);
  3 the Inference-Header-Content-Length *text* before the first NUL, the body after it.
  Bit 2: a backend's answer (HTTP → gRPC response) instead of a client's request.
  Bits 3-4: Content-Encoding — 1 gzip (compressed here), 2 deflate (compressed here),
  3 "deflate" over the uncompressed bytes (a body that does not inflate).
- byte 1: the depth limit (low 4 bits + 1) and the chunk size of the streamed depth scan.
- the rest: the body.

Checks (any other exception, or a FuzzBug, is a bug):
- only GatewayError escapes http_request_to_grpc / http_answer_to_grpc (codec/convert.py);
- what they produce parses with protobuf, decodes with the gRPC codec to the same tensors,
  and routes (codec/wire.py) to the same model, version and sequence as the HTTP body;
- the request re-encoded as HTTP (binary and JSON) decodes to the same tensors;
- no JSON true/false in a numeric tensor's data was converted (numpy reads one beside numbers as 1 / 0);
- too_deep (codec/jsondepth.py) agrees with the depth of what Python's json module parses,
  and with JsonScanner (codec/jsonscan.py) fed in chunks and InflatingScanner fed the
  compressed body; the skeleton is the same however the text is chunked or compressed, and
  parses to the document with its "data" arrays emptied;
- sequence_of_json (pass-through affinity) raises only for a repeated member name, and agrees with
  the decoded request;
- the decoders (codec/jsonfast.py's reading first) answer what the plain reading answers: the same
  tensors byte for byte, or the same refusal.
"""
from __future__ import annotations

import json
import zlib
from typing import Any

from fuzz._support import FuzzBug, check, instrumented, run

# jsondepth compares numpy arrays with scalars (see _support.instrumented); vectorised, it has
# few branches to guide the fuzzer anyway, and the differential checks below still run on it.
with instrumented(__name__ == "__main__", ("gateway",), exclude=("gateway.codec.jsondepth",)):
    from fuzz._compare import same_outputs, same_params, same_tensors
    from gateway._pb import grpc_predict_v2_pb2 as pb
    from gateway.codec import content, convert
    from gateway.codec import grpc as grpc_codec
    from gateway.codec import httpdecode, httpencode
    from gateway.codec.jsondepth import InflatingScanner, too_deep
    from gateway.codec.jsonscan import JsonScanner, skeleton
    from gateway.codec.wire import scan_infer_routing
    from gateway.errors import GatewayError, InvalidRequest

__all__ = ["json_depth", "one_input"]

LIMIT = 1 << 20  # max_message_bytes for decompression
_MAX_FEEDS = 64


def json_depth(doc: Any) -> int:
    """Nesting depth of a parsed JSON value (arrays and objects), without recursion."""
    best = 0
    stack = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            depth += 1
            best = max(best, depth)
            stack.extend((v, depth) for v in (value.values() if isinstance(value, dict) else value))
    return best


def _shape(data: bytes) -> tuple[int, int, bytes, str | None]:
    """(flags, extra, body, Inference-Header-Content-Length text) of a fuzz input."""
    flags, extra = data[0], data[1]
    mode = flags & 3
    rest = data[2:]
    if mode == 0:
        return flags, extra, rest, None
    if mode == 1:
        head, sep, tail = rest.partition(b"\0")
        return flags, extra, head + tail, str(len(head)) if sep else None
    if mode == 2:
        length = int.from_bytes(rest[:2], "big") % (len(rest) + 2)  # may point past the end
        return flags, extra, rest[2:], str(length)
    text, sep, body = rest.partition(b"\0")
    return flags, extra, body, text.decode("latin-1") if sep else None


def _emptied(value: Any) -> Any:
    """The document a skeleton parses to: every member named "data" holding an array, emptied."""
    if isinstance(value, dict):
        return {k: [] if k == "data" and isinstance(v, list) else _emptied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_emptied(v) for v in value]
    return value


def _check_depth(jpart: bytes, limit: int, chunk: int) -> bool:
    whole = too_deep(jpart, limit)
    chunk = max(chunk, len(jpart) // _MAX_FEEDS + 1)
    scanner = JsonScanner(limit, True)
    for i in range(0, len(jpart), chunk):
        scanner.feed(jpart[i : i + chunk])
    check(scanner.exceeded == whole, f"JsonScanner in chunks of {chunk} says {scanner.exceeded}, too_deep {whole}")
    if not whole:
        check(scanner.skeleton() == skeleton(jpart), f"the skeleton in chunks of {chunk} differs from the whole's")
    try:
        doc = json.loads(jpart.decode("utf-8"))
    except (ValueError, RecursionError):
        return whole  # not JSON: no reference answer (the backend refuses it)
    # (every member counted, a repeated name's too: the text nests as deep as its deepest value)
    depth = json_depth(json.loads(jpart.decode("utf-8"),
                                  object_pairs_hook=lambda pairs: {i: v for i, (_, v) in enumerate(pairs)}))
    check(whole == (depth > limit), f"too_deep says {whole} for depth {depth}, limit {limit}")
    if not whole and b"\\" not in jpart:  # (a key spelled with escapes is kept whole: larger, not wrong)
        # (compared as re-serialised text: NaN, which Python's json reads, is not equal to itself)
        check(json.dumps(json.loads(scanner.skeleton())) == json.dumps(_emptied(doc)),
              "the skeleton is not the document without its data")
    return whole


def _holds_bool(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, bool):
            return True
        if isinstance(v, list):
            stack.extend(v)
    return False


def _no_bool_as_number(plain: bytes, ihcl: str | None) -> None:
    """A converted request's numeric tensors held no JSON true/false (numpy would have read one
    beside numbers as 1 / 0: a changed value)."""
    hl = content.header_length(ihcl, len(plain))
    try:
        doc = json.loads(plain[: len(plain) if hl is None else hl].decode("utf-8"))
    except ValueError:  # (text orjson reads and Python's json does not: nothing to compare)
        return
    for t in doc.get("inputs", []) if isinstance(doc, dict) else []:
        if isinstance(t, dict) and t.get("datatype") not in ("BOOL", "BYTES") and _holds_bool(t.get("data")):
            raise FuzzBug(f"tensor {t.get('name')!r}: JSON true/false in {t.get('datatype')} data was converted")


def _as_plain(plain: bytes, ihcl: str | None, response: bool) -> None:
    """The public decoder (fast reading first) against the plain reading alone."""
    outcomes: list[Any] = []
    for decode in (httpdecode.decode_response if response else
                   lambda view, hl: httpdecode.decode_request(view, hl, "m", "1"),
                   (lambda view, hl: httpdecode._response(view, hl, False)) if response else
                   (lambda view, hl: httpdecode._request(view, hl, "m", "1", False))):
        try:
            outcomes.append(decode(memoryview(plain), content.header_length(ihcl, len(plain))))
        except GatewayError as exc:
            outcomes.append((type(exc).__name__, exc.message))
    got, want = outcomes
    if isinstance(got, tuple) or isinstance(want, tuple):
        check(got == want, f"decoded {got!r}, the plain reading {want!r}")
        return
    tensors = (got.outputs, want.outputs) if response else (got.inputs, want.inputs)
    same_tensors(*tensors, "fast reading vs plain reading")
    fields = ("model_name", "model_version", "id", "parameters") + (() if response else ("outputs",))
    check(all(getattr(got, f) == getattr(want, f) for f in fields),
          "fast reading vs plain reading: the request or response differs")


def _check_request(body: bytes, headers: dict[str, str], plain: bytes, ihcl: str | None) -> None:
    _as_plain(plain, ihcl, False)
    try:
        parts, sequence, _form = convert.http_request_to_grpc(body, headers, "m", "1", LIMIT)
    except GatewayError:
        return
    message = b"".join(parts)  # (the message as its pieces go on the wire)
    req = httpdecode.decode_request(plain, content.header_length(ihcl, len(plain)), "m", "1")
    try:
        pb.ModelInferRequest.FromString(message)
    except Exception as exc:
        raise FuzzBug(f"the gateway wrote a ModelInferRequest protobuf cannot parse: {exc!r}") from exc
    _no_bool_as_number(plain, ihcl)
    back = grpc_codec.decode_request(message)
    same_tensors(req.inputs, back.inputs, "HTTP -> gRPC request")
    same_outputs(req.outputs, back.outputs, "HTTP -> gRPC request")
    same_params(dict(req.parameters), dict(back.parameters), "HTTP -> gRPC request")
    check(back.id == req.id, "HTTP -> gRPC request: id differs")
    routing = scan_infer_routing(message)
    check(routing == ("m", "1", sequence), f"gRPC routing {routing} != ('m', '1', {sequence!r})")
    passthrough = content.sequence_of_json(plain, ihcl)
    check(passthrough is None or passthrough == sequence,
          f"pass-through affinity {passthrough!r} != converted {sequence!r}")
    for binary in (True, False):
        try:
            chunks, hl = httpencode.encode_request(req, binary=binary)
        except InvalidRequest:
            check(not binary, "encode_request(binary=True) refused a decoded request")
            continue
        again = httpdecode.decode_request(b"".join(chunks), hl, "m", "1")
        same_tensors(req.inputs, again.inputs, f"HTTP re-encoded (binary={binary})", exact=binary)
        check(again.id == req.id, "HTTP re-encoded: id differs")


def _check_response(body: bytes, headers: dict[str, str], plain: bytes, ihcl: str | None) -> None:
    _as_plain(plain, ihcl, True)
    try:
        message = convert.http_answer_to_grpc(body, headers, LIMIT, "b")
    except GatewayError:
        return
    resp = httpdecode.decode_response(plain, content.header_length(ihcl, len(plain)))
    try:
        pb.ModelInferResponse.FromString(message)
    except Exception as exc:
        raise FuzzBug(f"the gateway wrote a ModelInferResponse protobuf cannot parse: {exc!r}") from exc
    back = grpc_codec.decode_response(message)
    same_tensors(resp.outputs, back.outputs, "HTTP -> gRPC response")
    check((back.model_name, back.model_version, back.id) == (resp.model_name, resp.model_version, resp.id),
          "HTTP -> gRPC response: model, version or id differs")


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    flags, extra, plain, ihcl = _shape(data)
    headers = {} if ihcl is None else {"inference-header-content-length": ihcl}
    coding = (flags >> 3) & 3
    body = plain
    if coding == 1:
        body, headers["content-encoding"] = zlib.compress(plain, 1, wbits=31), "gzip"
    elif coding in (2, 3):
        body, headers["content-encoding"] = (zlib.compress(plain, 1) if coding == 2 else plain), "deflate"

    # The depth check, on the JSON part as the front end takes it (frontend/http.py json_part).
    hl = int(ihcl) if ihcl is not None and ihcl.isascii() and ihcl.isdigit() and int(ihcl) <= len(plain) else None
    jpart = plain[:hl] if hl is not None else plain
    limit, chunk = (extra & 15) + 1, (extra >> 4) + 1
    deep = _check_depth(jpart, limit, chunk)
    if coding in (1, 2):
        inflating = InflatingScanner(JsonScanner(limit, True), headers["content-encoding"], hl)
        step = max(chunk, len(body) // _MAX_FEEDS + 1)
        for i in range(0, len(body), step):
            inflating.feed(body[i : i + step])
        check(inflating.exceeded == deep, f"InflatingScanner says {inflating.exceeded}, too_deep {deep}")
        if not deep:
            check(inflating.scanner.skeleton() == skeleton(jpart), "the inflated skeleton differs from the plain one")

    try:
        content.sequence_of_json(plain, ihcl)  # pass-through affinity
    except InvalidRequest as exc:
        # Its one refusal: a repeated member name (the backend would read another sequence_id
        # than the one routed by; codec/jsondup.py). Anything else is a bug.
        check("repeats the member name" in exc.message, f"sequence_of_json raised {exc.message!r}")
    if flags & 4:
        _check_response(body, headers, plain, ihcl)
    else:
        _check_request(body, headers, plain, ihcl)


if __name__ == "__main__":
    run(one_input)
