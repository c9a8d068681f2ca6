"""The demo server's numpy models (gateway/demo/models.py), called directly."""
from __future__ import annotations

import numpy as np
import pytest

from gateway.codec.datatypes import DATATYPES, from_numpy, to_numpy
from gateway.demo.models import Model, ModelRepository, default_repository, demo_models
from gateway.errors import InvalidRequest, ModelNotFound
from gateway.model import InferRequest, RequestedOutput, Tensor

REPO = default_repository()
RNG = np.random.default_rng(7)

ALL_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                 "FP16", "BF16", "FP32", "FP64", "BYTES"]


def fp32(name: str, values) -> Tensor:
    return from_numpy(name, np.asarray(values, dtype=np.float32))


def add_sub_request(a, b, **kw) -> InferRequest:
    return InferRequest("add_sub", inputs=(fp32("INPUT0", a), fp32("INPUT1", b)), **kw)


def sample(datatype: str, shape: tuple[int, ...]) -> Tensor:
    """A tensor of ``datatype`` filled with varied values (BF16 as raw bit patterns)."""
    n = int(np.prod(shape))
    if datatype == "BYTES":
        elems = [bytes(RNG.integers(0, 256, size=i % 5, dtype=np.uint8)) for i in range(n)]
        arr = np.empty(n, dtype=object)
        arr[:] = elems
        return from_numpy("INPUT0", arr.reshape(shape), "BYTES")
    if datatype == "BF16":
        return from_numpy("INPUT0", RNG.integers(0, 2**16, size=shape, dtype=np.uint16), "BF16")
    if datatype == "BOOL":
        return from_numpy("INPUT0", RNG.integers(0, 2, size=shape).astype(bool))
    dtype = DATATYPES[datatype].dtype
    if dtype.kind == "f":
        return from_numpy("INPUT0", RNG.standard_normal(shape).astype(dtype), datatype)
    info = np.iinfo(dtype)
    return from_numpy("INPUT0", RNG.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True))


# --- metadata and the repository ---------------------------------------------


def test_every_test_model_is_served():
    assert set(REPO) == {"add_sub", "string_reverse"} | {f"identity_{dt}" for dt in ALL_DATATYPES}


def test_add_sub_metadata_is_triton_shaped():
    spec = lambda n: {"name": n, "datatype": "FP32", "shape": [-1]}
    assert REPO.metadata("add_sub") == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [spec("INPUT0"), spec("INPUT1")],
        "outputs": [spec("OUTPUT0"), spec("OUTPUT1")],
    }
    assert list(REPO.metadata("add_sub")) == ["name", "versions", "platform", "inputs", "outputs"]


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_identity_metadata(datatype):
    md = REPO.metadata(f"identity_{datatype}", "1")
    assert md["inputs"] == [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
    assert md["outputs"] == [{"name": "OUTPUT0", "datatype": datatype, "shape": [-1, -1]}]


def test_string_reverse_metadata():
    md = REPO.metadata("string_reverse")
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}]
    assert md["outputs"] == [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [-1]}]


def test_repository_is_a_read_only_mapping():
    assert isinstance(REPO["add_sub"], Model)
    assert len(REPO) == 16
    with pytest.raises(TypeError):
        REPO["x"] = REPO["add_sub"]  # type: ignore[index]
    with pytest.raises(ValueError, match="duplicate"):
        ModelRepository(demo_models() + demo_models()[:1])


@pytest.mark.parametrize("version", ["", "1", "01", "+1"])
def test_version_one_and_latest_resolve(version):
    assert REPO.resolve("add_sub", version) is REPO["add_sub"]
    assert REPO.is_ready("add_sub", version)


def test_unknown_version_is_not_found_in_triton_words():
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'add_sub' version 2 is not found$"):
        REPO.resolve("add_sub", "2")
    assert not REPO.is_ready("add_sub", "2")


def test_unknown_model_is_not_found_in_triton_words():
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'nope' is not found$"):
        REPO.metadata("nope")
    with pytest.raises(ModelNotFound):
        REPO.infer(InferRequest("nope"))
    assert not REPO.is_ready("nope", "")


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("abc", "failed to get model version from specified version string 'abc'"),
        ("-1", "invalid model version specified '-1'"),
        ("99999999999999999999", "failed to get model version"),
    ],
)
def test_unparsable_version_is_invalid_as_in_triton(version, message):
    with pytest.raises(InvalidRequest, match=message):
        REPO.resolve("add_sub", version)
    assert not REPO.is_ready("add_sub", version)


# --- add_sub --------------------------------------------------------------------


def test_add_sub_values():
    a = RNG.standard_normal(16).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    resp = REPO.infer(add_sub_request(a, b, id="req-1"))
    assert (resp.model_name, resp.model_version, resp.id) == ("add_sub", "1", "req-1")
    assert [(t.name, t.datatype, t.shape) for t in resp.outputs] == [
        ("OUTPUT0", "FP32", (16,)),
        ("OUTPUT1", "FP32", (16,)),
    ]
    np.testing.assert_array_equal(to_numpy(resp.outputs[0]), a + b)
    np.testing.assert_array_equal(to_numpy(resp.outputs[1]), a - b)
    assert bytes(resp.outputs[0].data) == (a + b).astype("<f4").tobytes()


def test_add_sub_empty():
    resp = REPO.infer(add_sub_request([], []))
    assert [t.shape for t in resp.outputs] == [(0,), (0,)]
    assert all(t.data.nbytes == 0 for t in resp.outputs)


def test_add_sub_shape_mismatch():
    with pytest.raises(InvalidRequest, match=r"INPUT0 shape \[3\] != INPUT1 shape \[4\]"):
        REPO.infer(add_sub_request([1, 2, 3], [1, 2, 3, 4]))


@pytest.mark.parametrize(
    ("requested", "names"),
    [
        (["OUTPUT1"], ["OUTPUT1"]),
        (["OUTPUT0"], ["OUTPUT0"]),
        # Triton keeps the model's order, not the request's.
        (["OUTPUT1", "OUTPUT0"], ["OUTPUT0", "OUTPUT1"]),
    ],
)
def test_requested_outputs_subset(requested, names):
    req = add_sub_request([1, 2], [3, 4], outputs=tuple(RequestedOutput(n) for n in requested))
    resp = REPO.infer(req)
    assert [t.name for t in resp.outputs] == names
    got = {t.name: to_numpy(t).tolist() for t in resp.outputs}
    assert got == {k: v for k, v in {"OUTPUT0": [4, 6], "OUTPUT1": [-2, -2]}.items() if k in names}


# --- identity -------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3), (1, 1), (0, 3), (3, 0), (0, 0)])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_identity_passes_bytes_through(datatype, shape):
    t = sample(datatype, shape)
    resp = REPO.infer(InferRequest(f"identity_{datatype}", id="i", inputs=(t,)))
    (out,) = resp.outputs
    assert (out.name, out.datatype, out.shape) == ("OUTPUT0", datatype, shape)
    assert bytes(out.data) == bytes(t.data)
    assert out.data is t.data  # no copy
    if datatype not in ("BF16",):
        np.testing.assert_array_equal(to_numpy(out), to_numpy(t))


# --- string_reverse ---------------------------------------------------------------


def test_string_reverse():
    values = [b"hello", b"", b"\x00\xff\x01", "żółw".encode(), b"a" * 1000]
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    resp = REPO.infer(InferRequest("string_reverse", inputs=(from_numpy("INPUT0", arr, "BYTES"),)))
    (out,) = resp.outputs
    assert (out.name, out.datatype, out.shape) == ("OUTPUT0", "BYTES", (5,))
    assert to_numpy(out).tolist() == [v[::-1] for v in values]


def test_string_reverse_empty_tensor():
    t = from_numpy("INPUT0", np.empty(0, dtype=object), "BYTES")
    (out,) = REPO.infer(InferRequest("string_reverse", inputs=(t,))).outputs
    assert out.shape == (0,) and out.data.nbytes == 0


# --- request errors ----------------------------------------------------------------


def test_missing_input_names_it():
    req = InferRequest("add_sub", inputs=(fp32("INPUT0", [1.0]),))
    with pytest.raises(InvalidRequest) as info:
        REPO.infer(req)
    assert str(info.value) == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
        "Please provide all required input(s)."
    )


def test_too_many_inputs():
    req = InferRequest("add_sub", id="7", inputs=(fp32("INPUT0", [1]), fp32("INPUT1", [1]), fp32("X", [1])))
    with pytest.raises(InvalidRequest, match=r"^\[request id: 7\] expected 2 inputs but got 3 inputs"):
        REPO.infer(req)


def test_unknown_input_name():
    req = InferRequest("add_sub", inputs=(fp32("INPUT0", [1]), fp32("INPUTX", [1])))
    with pytest.raises(InvalidRequest, match=r"^unexpected inference input 'INPUTX' for model 'add_sub'$"):
        REPO.infer(req)


def test_duplicate_input_name():
    req = InferRequest("add_sub", inputs=(fp32("INPUT0", [1]), fp32("INPUT0", [1])))
    with pytest.raises(InvalidRequest, match="input 'INPUT0' already exists in request"):
        REPO.infer(req)


def test_wrong_datatype_names_input():
    req = InferRequest("add_sub", inputs=(fp32("INPUT0", [1]), from_numpy("INPUT1", np.array([1], np.int32))))
    with pytest.raises(
        InvalidRequest, match=r"inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    ):
        REPO.infer(req)


def test_wrong_rank_names_input():
    t = from_numpy("INPUT0", np.zeros(4, np.int8))
    with pytest.raises(
        InvalidRequest,
        match=r"unexpected shape for input .INPUT0. for model .identity_INT8.. Expected \[-1,-1\], got \[4\]"
    ):
        REPO.infer(InferRequest("identity_INT8", inputs=(t,)))


def test_negative_dimension():
    t = Tensor("INPUT0", "INT8", (-1, 2), memoryview(b"\0\0"))
    with pytest.raises(InvalidRequest, match="All input dimensions should be specified for input 'INPUT0'"):
        REPO.infer(InferRequest("identity_INT8", inputs=(t,)))


@pytest.mark.parametrize(
    "tensor",
    [
        Tensor("INPUT0", "INT32", (1, 2), memoryview(b"\0" * 7)),
        Tensor("INPUT0", "BYTES", (1, 2), memoryview(b"\1\0\0\0a")),  # one element of two
        Tensor("INPUT0", "BYTES", (1, 1), memoryview(b"\x09\0\0\0a")),  # element overruns
    ],
)
def test_data_size_mismatch(tensor):
    with pytest.raises(InvalidRequest, match="INPUT0"):
        REPO.infer(InferRequest(f"identity_{tensor.datatype}", inputs=(tensor,)))


def test_unknown_requested_output():
    req = add_sub_request([1], [1], outputs=(RequestedOutput("OUTPUT9"),))
    with pytest.raises(InvalidRequest, match=r"^unexpected inference output 'OUTPUT9' for model 'add_sub'$"):
        REPO.infer(req)


def test_duplicate_requested_output():
    req = add_sub_request([1], [1], outputs=(RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT0")))
    with pytest.raises(InvalidRequest, match="output 'OUTPUT0' already exists in request"):
        REPO.infer(req)


def test_versioned_infer_answers_version_one():
    resp = REPO.infer(add_sub_request([1], [2], model_version="1", id="v"))
    assert (resp.model_version, resp.id) == ("1", "v")
    with pytest.raises(ModelNotFound):
        REPO.infer(add_sub_request([1], [2], model_version="3"))
