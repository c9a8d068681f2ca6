"""codec/grpcscan.py: the wire walk that reads a ModelInferRequest's routing fields and checks
its limits gives protobuf's answer — the one the parsed message (the exact path) gives — for
any request and any limits; what it cannot read it leaves to that path."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway._pb import grpc_predict_v2_pb2 as pb
from gateway.codec import grpcscan
from gateway.codec.grpcscan import PARSE_MAX, InferScan, scan_checked
from gateway.codec.limits import check_pb
from gateway.codec.wire import scan_infer_routing
from gateway.config.security import Limits
from gateway.errors import InvalidRequest, LimitExceeded, NegativeDimension

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
DIM = st.one_of(st.integers(-3, 40), st.integers(1, 1 << 40), INT64)
TEXT = st.one_of(st.text("ab", max_size=13), st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                                                     max_size=12))

limits_st = st.builds(Limits, max_tensors=st.integers(1, 6), max_dims=st.integers(1, 6),
                      max_elements=st.integers(1, 1 << 40), max_name_length=st.integers(1, 12),
                      max_id_length=st.integers(1, 12))


@st.composite
def requests(draw) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=draw(TEXT), model_version=draw(TEXT), id=draw(TEXT))
    for _ in range(draw(st.integers(0, 7))):
        t = req.inputs.add(name=draw(TEXT), datatype=draw(st.sampled_from(["FP32", "BYTES", ""])))
        t.shape.extend(draw(st.lists(DIM, max_size=8)))
        if draw(st.booleans()):
            t.parameters["binary_data_size"].int64_param = draw(INT64)
    for _ in range(draw(st.integers(0, 7))):
        req.outputs.add(name=draw(TEXT))
    for _ in range(draw(st.integers(0, 2))):
        req.raw_input_contents.append(draw(st.binary(max_size=40)))
    kind = draw(st.sampled_from(["none", "int64", "uint64", "string", "other"]))
    if kind == "int64":
        req.parameters["sequence_id"].int64_param = draw(INT64)
    elif kind == "uint64":
        req.parameters["sequence_id"].uint64_param = draw(st.integers(0, (1 << 64) - 1))
    elif kind == "string":
        req.parameters["sequence_id"].string_param = draw(TEXT)
    elif kind == "other":
        req.parameters["priority"].int64_param = 1
    return req


def outcome(fn):
    try:
        return "ok", fn()
    except (LimitExceeded, NegativeDimension):
        return "refused", None  # (which refusal is named first may differ: each path checks as it reads)
    except InvalidRequest:
        return "invalid", None


def exact(data: bytes, limits: Limits):
    """The parsed message's answer: the path the walk hands what it does not read to."""
    return grpcscan._checked_parse(pb.ModelInferRequest.FromString(data), limits)


@settings(max_examples=400, deadline=None)
@given(requests(), limits_st)
def test_the_walk_answers_as_the_parsed_message(req, limits):
    data = req.SerializeToString()
    assert outcome(lambda: InferScan(limits).scan(data)) == outcome(lambda: exact(data, limits))


@settings(max_examples=150, deadline=None)
@given(requests(), limits_st)
def test_large_messages_are_walked_too(req, limits):
    """Past PARSE_MAX nothing is parsed: a request without parameters gets the walk's answer,
    still the parsed message's; one with parameters, codec/wire.py's walk and check_pb's (which
    does not read a string sequence_id)."""
    req.raw_input_contents.append(b"\0" * (PARSE_MAX + 1))
    data = req.SerializeToString()
    got = outcome(lambda: scan_checked(data, limits))
    if not req.parameters:
        assert got == outcome(lambda: exact(data, limits))
        return

    def walk():
        routing = scan_infer_routing(data)
        check_pb(data, limits)
        return routing

    assert got == outcome(walk)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), limits_st)
def test_bytes_that_are_no_request_are_refused_or_read_as_protobuf_reads_them(data, limits):
    got = outcome(lambda: scan_checked(data, limits))
    try:
        req = pb.ModelInferRequest.FromString(data)
    except Exception:
        assert got == ("invalid", None)
        return
    if got[0] == "ok":
        sequence = None
        if "sequence_id" in req.parameters:
            sequence = grpcscan._sequence(req.parameters["sequence_id"])
        assert got[1] == (req.model_name, req.model_version, sequence)


def test_the_common_request_is_walked_not_parsed(monkeypatch):
    """A request without parameters never reaches the parsed-message path (what makes it cheap)."""
    req = pb.ModelInferRequest(model_name="add_sub", id="bench")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="FP32").shape.extend([1, 16])
    req.raw_input_contents.extend([bytes(64), bytes(64)])
    data = req.SerializeToString()
    assert grpcscan.InferScan(Limits())._walked(data) == ("add_sub", "")
    assert scan_checked(data, Limits()) == ("add_sub", "", None)


@pytest.mark.parametrize("shape, limit", [
    ((1 << 20, 1 << 20), "max_elements"),  # the product passes, each dimension does not
    ((2,) * 7, "max_dims"),
    ((1 << 62, 4), "max_elements"),  # past the compiled code's unboxed integers
    (((1 << 63) - 1,), "max_elements"),
])
def test_each_shape_refusal_names_its_limit(shape, limit):
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="IN").shape.extend(shape)
    with pytest.raises(LimitExceeded, match=f"limits.{limit}"):
        scan_checked(req.SerializeToString(), Limits(max_dims=6))


@pytest.mark.parametrize("shape", [(-1, 1 << 40), ((1 << 63) * -1, 5), (0, -1, 1 << 40), (3, -2)])
@pytest.mark.parametrize("pad", [0, 1 << 20], ids=["parsed", "walked"])
def test_a_negative_dimension_is_refused(shape, pad):
    """Not a size: refused before routing (Triton 2.51's HTTP side answers it with a 500),
    whether the message is parsed or, past PARSE_MAX, walked."""
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="IN").shape.extend(shape)
    if pad:
        req.raw_input_contents.append(bytes(pad))
    with pytest.raises(NegativeDimension, match=r"tensor 'IN': shape \[.*\] has a negative dimension"):
        scan_checked(req.SerializeToString(), Limits())


@pytest.mark.parametrize("shape", [(0, 1 << 40, 1 << 40), (0, (1 << 63) - 1), (1 << 20, 0, 1 << 20), (1 << 40, 0)])
def test_a_zero_does_not_exempt_the_other_dimensions(shape):
    """[0, 2**63-1] holds no elements, but backends size buffers from the other dimensions
    (Triton's Python backend dies on it): its other dimensions are held to max_elements."""
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="IN").shape.extend(shape)
    with pytest.raises(LimitExceeded, match=r"dimensions other than 0\) of more than 2147483648 elements "
                                            r"\(limits.max_elements\)"):
        scan_checked(req.SerializeToString(), Limits())
    assert scan_checked(pb.ModelInferRequest(model_name="m", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="IN", shape=[0, 1 << 31])]).SerializeToString(), Limits()) == \
        ("m", "", None)


@pytest.mark.parametrize("text, refused", [("a" * 8, False), ("a" * 9, True), ("é" * 8, False), ("é" * 9, True)])
def test_names_and_ids_are_measured_in_characters_at_the_limit(text, refused):
    """A length limit counts characters, as the parsed message does (a multi-byte name of
    max_name_length characters passes, though its bytes are more)."""
    limits = Limits(max_name_length=8, max_id_length=8)
    cases = [pb.ModelInferRequest(model_name="m", id=text)]
    cases.append(pb.ModelInferRequest(model_name="m"))
    cases[-1].inputs.add(name=text).shape.append(1)
    cases.append(pb.ModelInferRequest(model_name="m"))
    cases[-1].outputs.add(name=text)
    for req in cases:
        for data in (req.SerializeToString(), _large(req)):
            if refused:
                with pytest.raises(LimitExceeded):
                    scan_checked(data, limits)
            else:
                assert scan_checked(data, limits) == ("m", "", None)


def _large(req: pb.ModelInferRequest) -> bytes:
    big = pb.ModelInferRequest()
    big.CopyFrom(req)
    big.raw_input_contents.append(b"\0" * (PARSE_MAX + 1))
    return big.SerializeToString()


def _field(fnum: int, payload: bytes) -> bytes:
    return bytes([fnum << 3 | 2, len(payload)]) + payload


BAD = b"\xff\xfe"  # not UTF-8
INPUT = _field(1, b"IN") + _field(2, b"FP32") + _field(3, b"\x02")


@pytest.mark.parametrize("data", [
    _field(1, BAD),  # model_name
    _field(1, b"m") + _field(2, BAD),  # model_version
    _field(1, b"m") + _field(3, BAD),  # id
    _field(1, BAD) + _field(1, b"m"),  # a repeated field: protobuf parses every occurrence
    _field(1, b"m") + _field(5, _field(1, BAD)),  # a tensor's name
    _field(1, b"m") + _field(5, _field(2, BAD)),  # a tensor's datatype
    _field(1, b"m") + _field(5, _field(3, b"\x80")),  # a packed shape cut short
    _field(1, b"m") + _field(6, _field(1, BAD)),  # an output's name
    _field(1, b"m") + _field(5, INPUT + _field(5, b"\x0a\x01")),  # typed contents cut short (unread by the walk)
    _field(1, b"m") + _field(5, INPUT + _field(4, _field(1, BAD))),  # a tensor parameter's key
    _field(1, b"m") + _field(6, _field(1, b"OUT") + _field(2, _field(1, BAD))),  # an output parameter's key
    _field(1, b"m") + _field(5, INPUT + bytes([0xFA, 0xFF, 0xFF, 0xFF, 0x1F, 0])),  # ... in a tensor
    _field(1, b"m") + bytes([0xFA, 0xFF, 0xFF, 0xFF, 0x1F, 0]),  # field number 2^30: not a protobuf tag
    # Field 32 (an unknown varint) with its tag written in 8 bytes: upb refuses a tag past 5
    # (found by fuzz/grpc_wire.py), in an output and at the top.
    _field(1, b"m") + _field(6, bytes([0x80, 0x82, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x80, 0x20])),
    _field(1, b"m") + bytes([0x80, 0x82, 0x80, 0x80, 0x80, 0x80, 0x00, 0x01]),
])
def test_what_protobuf_refuses_the_walk_does_not_vouch_for(data):
    assert InferScan(Limits())._walked(data) is None
    with pytest.raises(InvalidRequest):
        scan_checked(data, Limits())


def test_the_walk_reads_what_protobuf_reads():
    data = (_field(1, b"old") + _field(2, "é".encode()) + _field(1, "mødel".encode()) + _field(5, INPUT)
            + bytes([0x38, 5])  # raw_input_contents (7) as a varint: an unknown field to protobuf
            + _field(15, b"\xff") + _field(7, b"\xff\xfe"))  # unknown and bytes fields: not text
    req = pb.ModelInferRequest.FromString(data)
    assert InferScan(Limits())._walked(data) == (req.model_name, req.model_version) == ("mødel", "é")


def test_an_oversized_string_is_refused_by_its_length_alone():
    """An id of 4 × max_id_length bytes and more is too long whatever its bytes: the walk does not
    read it (an attacker's megabytes of id cost nothing), and the exact path names the limit."""
    limits = Limits(max_id_length=8)
    data = pb.ModelInferRequest(model_name="m", id="a" * 33).SerializeToString()
    assert InferScan(limits)._walked(data) is None
    with pytest.raises(LimitExceeded, match="max_id_length"):
        scan_checked(data, limits)
    for ok in ("é" * 8, "𝄞" * 8):  # 16 and 32 bytes: within 8 characters
        assert scan_checked(pb.ModelInferRequest(model_name="m", id=ok).SerializeToString(), limits)[0] == "m"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.parametrize("dims, refused", [((1 << 40, 1 << 40), True), ((2,) * 7, True), ((4, 4), False)])
def test_a_shape_written_unpacked_is_read_as_protobuf_reads_it(dims, refused):
    """Protobuf takes a repeated int64 packed or one varint per element (field 3, wire type 0);
    the walk counts both."""
    tensor = _field(1, b"IN") + b"".join(b"\x18" + _varint(d) for d in dims)
    data = _field(1, b"m") + _field(5, tensor)
    assert list(pb.ModelInferRequest.FromString(data).inputs[0].shape) == list(dims)
    if refused:
        with pytest.raises(LimitExceeded):
            scan_checked(data, Limits(max_dims=6))
    else:
        assert InferScan(Limits(max_dims=6))._walked(data) == ("m", "")
