"""The lines of a metrics page handed to the queue-depth parser: reading only them gives what
reading the whole page gives."""
from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gateway.codec.queue_metrics import PENDING, parse_pending
from gateway.codec.queue_page import pending_lines

_LINES = st.sampled_from([
    b'nv_inference_pending_request_count{model="m",version="1"} 0',
    b'nv_inference_pending_request_count{model="m",version="2"} 3',
    b'nv_inference_pending_request_count{model="n",version="1"} 0.0',
    b'nv_inference_pending_request_count{model="n",version=""} 0 1700000000',
    b'nv_inference_pending_request_count{model="x} 0",version="1"} 2',
    b'nv_inference_pending_request_count{model="y",version="1"}7',
    b'nv_inference_pending_request_count{model="z",version="1"} 0\r',
    b'nv_inference_pending_request_count{model="z",version="1"} 5\r',
    b'nv_inference_pending_request_count{model="w",version="1"} 10',
    b'nv_inference_request_success{model="m",version="1"} 12',
    b'nv_inference_request_success{model="m",version="1"} 0',
    b'other{a="nv_inference_pending_request_count{model=\\"q\\"} 4"} 0',
    b'other nv_inference_pending_request_count{model="q",version="1"} 4',
    b"# TYPE nv_inference_pending_request_count gauge",
    b"",
    b" 0",
])


@given(st.lists(st.one_of(_LINES, st.binary(max_size=40)), max_size=12), st.booleans())
@example([b'nv_inference_pending_request_count{model="m",version="1"} 4'], False)
@example([b'nv_inference_pending_request_count{model="m",version="1"} 0'], False)
@example([b"nv_inference_pending_request_count{} 0", b"x nv_inference_pending_request_count{model=\"m\"} 1"], True)
def test_the_lines_read_give_what_the_page_gives(lines, newline_at_end):
    page = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    assert parse_pending(pending_lines(page)) == parse_pending(page)


def test_a_page_of_zero_counts_leaves_nothing_to_read():
    zeros = b"".join(b'%smodel="model-%d",version="1"} 0\n' % (PENDING, i) for i in range(10_000))
    page = b"# HELP x\n# TYPE x gauge\n" + zeros + b"nv_cpu_utilization 0.01\n"
    assert pending_lines(page) == b""
    busy = page.replace(b'"model-7",version="1"} 0\n', b'"model-7",version="1"} 2\n')
    assert pending_lines(busy) == PENDING + b'model="model-7",version="1"} 2\n'
    assert parse_pending(pending_lines(busy)) == parse_pending(busy) == {("model-7", "1"): 2.0, ("model-7", ""): 2.0}
