"""A misbehaving gRPC backend for tests: HTTP/2 spoken with the ``h2`` library on a real
listening socket (127.0.0.1, port 0, read back), its own asyncio loop in a thread.

It answers the health RPCs as a V2 server should (ServerLive, ServerReady, ModelReady,
Triton's RepositoryIndex listing every behaviour below as a READY model), so the gateway's
checker takes it for a healthy backend; its ModelInfer then does what the requested model's
name says (:data:`BEHAVIOURS`). Every other RPC is UNIMPLEMENTED.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import struct
import threading
import zlib

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec.repository import IndexEntry, encode_index_pb

__all__ = ["BEHAVIOURS", "STATUS_DETAILS", "BadGrpc", "ok_answer"]

PREFIX = "/inference.GRPCInferenceService/"

# What ModelInfer does, by the requested model's name.
BEHAVIOURS = {
    "ok": "a valid ModelInferResponse",
    "reset_before_headers": "RST_STREAM(CANCEL) before any response header",
    "reset_after_headers": "response headers, then RST_STREAM(CANCEL)",
    "reset_mid_message": "headers and half a message, then RST_STREAM(CANCEL)",
    "reset_internal": "RST_STREAM(INTERNAL_ERROR) before any response header",
    "refused_stream": "RST_STREAM(REFUSED_STREAM): the stream was not processed (RFC 9113 8.7)",
    "refused_once": "RST_STREAM(REFUSED_STREAM) on every other call (the first refused), a valid answer between",
    "goaway_unprocessed": "GOAWAY whose last stream id is below the request's, then close: nothing ran",
    "goaway_processed": "GOAWAY(INTERNAL_ERROR) covering the request, then close, unanswered",
    "close": "the connection closed without a word",
    "too_large": "an answer over the gateway's max_message_bytes (the backend's ``large`` bytes)",
    "garbage": "a gRPC message that is not a ModelInferResponse",
    "bad_frame": "a length prefix promising more than the stream carries",
    "unknown_status": "grpc-status: 42",
    "bad_encoding": "grpc-encoding: snappy (not negotiated), a compressed message",
    "bad_gzip": "grpc-encoding: gzip, a compressed message that is not gzip",
    "compressed_identity": "the compressed flag set with no grpc-encoding",
    "no_status": "trailers without grpc-status",
    "silent": "never answers",
    "huge_metadata": "response headers carrying 1 MiB of metadata (one header and many)",
    "own_cancelled": "grpc-status CANCELLED with the backend's own message",
    "own_exhausted": "grpc-status RESOURCE_EXHAUSTED with the backend's own message (its queue)",
    "own_too_large": "grpc-status RESOURCE_EXHAUSTED 'Received message larger than max' from the backend's own "
                     "grpc (the request was over ITS limit)",
    "own_details": "grpc-status INVALID_ARGUMENT with grpc-status-details-bin (a google.rpc.Status)",
    # Answers of the backend's ``big`` bytes (the gateway relays those as they arrive, h2stream.Relay):
    "big_ok": "a valid ModelInferResponse of ``big`` bytes of output",
    "big_reset_mid": "headers and half the big message, then RST_STREAM(CANCEL)",
    "big_close": "headers and half the big message, then the connection closes",
    "big_truncated": "a length prefix for the big message, half of it, then grpc-status 0",
    "big_two": "the big message twice, then grpc-status 0",
    "big_unavailable": "the whole big message, then grpc-status UNAVAILABLE with the backend's own message",
    "big_no_status": "the big message with END_STREAM on its last DATA: no trailers",
}
# own_details' google.rpc.Status: code 3, message "bad input", no details (field 1 varint, field 2 bytes).
STATUS_DETAILS = b"\x08\x03\x12\x09bad input"


def ok_answer(model: str) -> bytes:
    out = pb.ModelInferResponse(model_name=model, model_version="1", id="")
    t = out.outputs.add()
    t.name, t.datatype = "OUTPUT0", "FP32"
    t.shape.extend([1, 2])
    out.raw_output_contents.append(struct.pack("<2f", 1.5, -2.0))
    return out.SerializeToString()


def big_answer(model: str, n: int) -> bytes:
    """A ModelInferResponse whose one UINT8 output holds ``n`` bytes (a pattern, not zeros)."""
    out = pb.ModelInferResponse(model_name=model, model_version="1", id="")
    t = out.outputs.add()
    t.name, t.datatype = "OUTPUT0", "UINT8"
    t.shape.extend([n])
    out.raw_output_contents.append((bytes(range(251)) * (n // 251 + 1))[:n])
    return out.SerializeToString()


def _frame(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(message)) + message


class _Conn(asyncio.Protocol):
    def __init__(self, server: BadGrpc) -> None:
        self.server = server
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.requests: dict[int, tuple[dict[str, str], bytearray]] = {}
        self.pending: dict[int, list[tuple[str, object]]] = {}  # per stream: actions waiting for window
        self.held: list[tuple[int, int]] = []  # request bytes received and not acknowledged (holding)
        self.gone = False  # a GOAWAY went out: what still comes is read and dropped (_go_away)
        server.conns.add(self)

    def release(self) -> None:
        for n, sid in self.held:
            with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
                self.h2.acknowledge_received_data(n, sid)
        self.held.clear()
        self._flush()

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections += 1
        self.h2.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            self._close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self.requests[ev.stream_id] = (dict(ev.headers), bytearray())  # type: ignore[arg-type]
            elif isinstance(ev, h2.events.DataReceived):
                self.requests[ev.stream_id][1].extend(ev.data)
                if self.server.holding:
                    self.held.append((ev.flow_controlled_length, ev.stream_id))
                else:
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                headers, body = self.requests.pop(ev.stream_id)
                self._answer(ev.stream_id, headers.get(":path", ""), bytes(body), headers.get("grpc-encoding", ""))
            elif isinstance(ev, h2.events.StreamReset):
                self.server.resets += 1
                self.pending.pop(ev.stream_id, None)
                self.requests.pop(ev.stream_id, None)
            elif isinstance(ev, h2.events.WindowUpdated):
                self._drain()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.conns.discard(self)

    # -- writing -------------------------------------------------------------------------
    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _go_away(self) -> None:
        """Close after a GOAWAY as a server does: the end of the stream right behind it, what the
        peer still sends read and dropped, the socket let go a second later. Closed at once with
        the peer's bytes unread, the socket would send a reset instead, and a reset may cost the
        peer the GOAWAY still unread in its buffer (then it sees only a reset connection)."""
        self.gone = True
        transport = self.transport
        if transport is None:
            return
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(1.0, transport.abort)
        else:
            transport.close()

    def _headers(self, sid: int, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self.h2.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc"), *extra])

    def _trailers(self, sid: int, status: str | None, message: str = "",
                  extra: tuple[tuple[str, str], ...] = ()) -> None:
        fields = [] if status is None else [("grpc-status", status)]
        if message:
            fields.append(("grpc-message", message))
        fields += extra
        if not fields:
            fields = [("x-no-status", "1")]
        self.h2.send_headers(sid, fields, end_stream=True)

    def _reply(self, sid: int, message: bytes | None, status: str | None = "0", msg: str = "",
               headers: tuple[tuple[str, str], ...] = (), compressed: bool = False,
               trailers: tuple[tuple[str, str], ...] = ()) -> None:
        """Headers, the message (when any, flow-controlled), then trailers."""
        self._headers(sid, headers)
        actions: list[tuple[str, object]] = []
        if message is not None:
            actions.append(("data", _frame(message, compressed)))
        actions.append(("trailers", (status, msg, trailers)))
        self.pending[sid] = actions
        self._drain()

    def _drain(self) -> None:
        for sid in list(self.pending):
            actions = self.pending[sid]
            while actions:
                kind, value = actions[0]
                if kind == "trailers":
                    assert isinstance(value, tuple)
                    self._trailers(sid, *value)
                    actions.pop(0)
                    continue
                if kind == "reset":
                    self.h2.reset_stream(sid, value)  # type: ignore[arg-type]
                    actions.pop(0)
                    continue
                if kind == "close":
                    self._flush()
                    self._close()
                    self.pending.clear()
                    return
                data = value
                assert isinstance(data, bytes)
                window = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
                if window <= 0:
                    self.server.blocked += 1
                    break
                rest = data[window:]
                self.h2.send_data(sid, data[:window], end_stream=kind == "data_end" and not rest)
                self.server.sent += min(window, len(data))
                if rest:
                    actions[0] = (kind, rest)
                else:
                    actions.pop(0)
            if not actions:
                del self.pending[sid]
        self._flush()

    # -- answers -------------------------------------------------------------------------
    def _answer(self, sid: int, path: str, body: bytes, encoding: str = "") -> None:
        rpc = path.removeprefix(PREFIX)
        message = body[5:]
        if body[:1] == b"\x01":  # compressed (grpc-encoding gzip or deflate)
            message = zlib.decompress(message, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        if rpc == "ServerLive":
            self._reply(sid, pb.ServerLiveResponse(live=True).SerializeToString())
        elif rpc == "ServerReady":
            self._reply(sid, pb.ServerReadyResponse(ready=True).SerializeToString())
        elif rpc == "ModelReady":
            name = pb.ModelReadyRequest.FromString(message).name
            self._reply(sid, pb.ModelReadyResponse(ready=name in BEHAVIOURS).SerializeToString())
        elif rpc == "RepositoryIndex":
            self._reply(sid, encode_index_pb([IndexEntry(name, "1", True, "READY") for name in BEHAVIOURS]))
        elif rpc == "ModelInfer":
            model = pb.ModelInferRequest.FromString(message).model_name
            self.server.seen.append(model)
            self.server.bodies.append((model, hashlib.sha256(message).hexdigest()))
            self.server.encodings.append(encoding if body[:1] == b"\x01" else "")
            self._infer(sid, model, self.server.override.get(model, model))
        else:
            self._reply(sid, None, "12", f"{rpc} is not implemented here")

    def _infer(self, sid: int, name: str, model: str) -> None:
        h = self.h2
        if model == "ok":
            self._reply(sid, ok_answer(name))
        elif model == "reset_before_headers":
            h.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        elif model == "reset_after_headers":
            self._headers(sid)
            h.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        elif model == "reset_mid_message":
            self._headers(sid)
            frame = _frame(ok_answer(model))
            h.send_data(sid, frame[: len(frame) // 2])
            h.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        elif model == "reset_internal":
            h.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        elif model == "refused_stream":
            h.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif model == "refused_once":
            self.server.refusals += 1
            if self.server.refusals % 2:
                h.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            else:
                self._reply(sid, ok_answer(name))
        elif model == "goaway_unprocessed":
            # RFC 9113 6.8: streams above last_stream_id were not processed and may be retried.
            h.close_connection(h2.errors.ErrorCodes.NO_ERROR, last_stream_id=max(sid - 2, 0))
            self._flush()
            self._go_away()
        elif model == "goaway_processed":
            h.close_connection(h2.errors.ErrorCodes.INTERNAL_ERROR, last_stream_id=sid)
            self._flush()
            self._go_away()
        elif model == "close":
            self._close()
        elif model == "too_large":
            self._reply(sid, bytes(self.server.large))
        elif model == "garbage":
            self._reply(sid, b"\xff\xff\xff\xff this is not a protobuf message \x00\x01")
        elif model == "bad_frame":
            self._headers(sid)
            h.send_data(sid, struct.pack(">BI", 0, 1000) + b"short")
            self._trailers(sid, "0")
        elif model == "unknown_status":
            self._reply(sid, None, "42", "a status no gRPC version defines")
        elif model == "bad_encoding":
            self._reply(sid, b"\x00" * 32, headers=(("grpc-encoding", "snappy"),), compressed=True)
        elif model == "bad_gzip":
            self._reply(sid, b"not gzip at all", headers=(("grpc-encoding", "gzip"),), compressed=True)
        elif model == "compressed_identity":
            self._reply(sid, ok_answer(model), compressed=True)
        elif model == "no_status":
            self._reply(sid, ok_answer(model), status=None)
        elif model == "silent":
            pass
        elif model == "huge_metadata":
            self._reply(sid, ok_answer(name), headers=tuple((f"x-pad-{i}", "v" * 1000) for i in range(1024)))
        elif model == "own_cancelled":
            self._reply(sid, None, "1", "the backend cancelled this request itself")
        elif model == "own_exhausted":
            self._reply(sid, None, "8", "Exceeds maximum queue size")
        elif model == "own_details":
            details = base64.b64encode(STATUS_DETAILS).decode().rstrip("=")
            self._reply(sid, None, "3", "bad input", trailers=(("grpc-status-details-bin", details),))
        elif model == "own_too_large":
            self._reply(sid, None, "8", "Received message larger than max (5000000 vs. 4194304)")
        elif model.startswith("big_"):
            frame = _frame(big_answer(name, self.server.big))
            half = frame[: len(frame) // 2]
            ok: tuple[str, object] = ("trailers", ("0", "", ()))
            actions: list[tuple[str, object]] = {
                "big_ok": [("data", frame), ok],
                "big_reset_mid": [("data", half), ("reset", h2.errors.ErrorCodes.CANCEL)],
                "big_close": [("data", half), ("close", None)],
                "big_truncated": [("data", half), ok],
                "big_two": [("data", frame), ("data", frame), ok],
                "big_unavailable": [("data", frame), ("trailers", ("14", "the backend is busy", ()))],
                "big_no_status": [("data_end", frame)],
            }[model]
            self._headers(sid)
            self.pending[sid] = actions
            self._drain()
        else:
            self._reply(sid, None, "5", f"Request for unknown model: '{model}' is not found")


class BadGrpc:
    """``BadGrpc(large=..., override=...)``: serves until :meth:`close`; ``address`` is
    "127.0.0.1:port". ``large`` is the size of the ``too_large`` answer's message, ``big`` the
    output bytes of the ``big_*`` answers; ``override``
    maps a model to the behaviour it gets instead of its own; ``seen`` lists the models asked."""

    def __init__(self, large: int = 2 << 20, override: dict[str, str] | None = None, big: int = 600_000) -> None:
        self.large = large
        self.big = big  # the output bytes of the big_* answers
        self.sent = 0  # DATA bytes sent (all streams)
        self.blocked = 0  # times an answer waited for the gateway's flow-control window
        self.resets = 0  # streams the gateway reset
        self.refusals = 0  # refused_once calls received
        self.bodies: list[tuple[str, str]] = []  # (model, sha256 of the request message) per ModelInfer
        self.encodings: list[str] = []  # per ModelInfer (as bodies): its grpc-encoding if it came compressed, else ""
        self.holding = False  # request bytes are not acknowledged (hold() / release())
        self.conns: set[_Conn] = set()
        self.override = override or {}  # model -> the behaviour it gets here instead (a tame twin)
        self.seen: list[str] = []
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._server: asyncio.AbstractServer | None = None

        async def serve() -> None:
            self._server = await self._loop.create_server(lambda: _Conn(self), "127.0.0.1", 0)
            started.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="badgrpc", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("badgrpc did not start")
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"

    def hold(self) -> None:
        """From now on the request bytes received are not acknowledged: the gateway's window to
        this backend stays shut until :meth:`release`."""
        self.holding = True

    def release(self) -> None:
        def go() -> None:
            self.holding = False
            for conn in list(self.conns):
                conn.release()

        self._loop.call_soon_threadsafe(go)

    def close(self) -> None:
        def stop() -> None:
            assert self._server is not None
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)

    def __enter__(self) -> BadGrpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
