"""StreamHeld: a ModelStreamInfer's requests against admission control — each counted while
held, given back once, and whatever a stream that ended mid-message held given back at its end."""
from __future__ import annotations

import pytest

from gateway.errors import Overloaded
from gateway.admission import Admission, StreamHeld


def test_each_request_is_held_until_handed_on_and_given_back_once():
    admission = Admission(100, None)
    held = StreamHeld(admission, cost=2)
    held.take(30)  # counted at the path's factor
    assert admission.budget.used == 60
    held.give()
    assert admission.budget.used == 0
    admission.enter(60)  # another request in flight
    with pytest.raises(Overloaded):
        held.take(25)  # 60 + 50 > 100
    assert admission.budget.used == 60 and held.held == 0
    admission.leave(60)
    held.take(25)
    assert admission.budget.used == 50
    held.close()  # the stream ended while the message was still held
    assert admission.budget.used == 0 and admission.large_inflight == 0
    held.give()  # the generator resumed after the end: not given back twice
    held.close()
    assert admission.budget.used == 0


def test_a_large_request_marks_large_tensor_activity():
    admission = Admission(0, None)  # unbounded: counted only
    held = StreamHeld(admission)
    held.take(Admission.LARGE)
    assert admission.large_at > 0
    assert admission.large_inflight == 1
    held.give()
    assert admission.large_inflight == 0
    admission.large_at = 0.0
    held.close()  # answers flowed until the end: the quiet counts from there
    assert admission.budget.used == 0 and admission.large_at > 0
