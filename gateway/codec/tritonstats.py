"""Triton's model statistics (codec/triton.py): the HTTP ``/stats`` JSON and the gRPC
ModelStatistics message, and the statistics of a backend's endpoints summed into one."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
from google.protobuf.message import Message

from .._pb import triton_extensions_pb2 as tx
from ..errors import BadUpstreamResponse
from .tritonjson import M, _load, message_from_json, message_to_json, parse_message

__all__ = ["stats_from_json", "stats_from_pb", "stats_sum", "stats_to_json", "stats_to_pb"]

_UINT64_MAX = (1 << 64) - 1


# -- statistics --------------------------------------------------------------------------------

def stats_from_pb(answer: bytes) -> tx.ModelStatisticsResponse:
    return parse_message(tx.ModelStatisticsResponse, answer, "model statistics")


def stats_from_json(body: bytes | bytearray) -> tx.ModelStatisticsResponse:
    what = "model statistics"
    return message_from_json(tx.ModelStatisticsResponse, _load(body, what, BadUpstreamResponse), what,
                             BadUpstreamResponse)


def stats_to_json(stats: tx.ModelStatisticsResponse) -> bytes:
    return orjson.dumps(message_to_json(stats))


def stats_to_pb(stats: tx.ModelStatisticsResponse) -> bytes:
    return stats.SerializeToString()


def _add(a: int, b: int, what: str) -> int:
    total = a + b
    if total > _UINT64_MAX:
        raise BadUpstreamResponse(f"model statistics: the sum of {what} over the backend's endpoints exceeds uint64")
    return total


def _add_durations(acc: Message, other: Message) -> None:
    """Every StatisticDuration field of ``other`` added into ``acc`` (count and ns)."""
    for field, value in other.ListFields():
        if field.message_type is None:
            continue  # batch_size: the key, not a duration
        target = getattr(acc, field.name)
        target.count = _add(target.count, value.count, f"{field.name}.count")
        target.ns = _add(target.ns, value.ns, f"{field.name}.ns")


def _keyed(items: Iterable[M], key: Callable[[M], Any]) -> dict[Any, M]:
    return {key(x): x for x in items}


def stats_sum(parts: Sequence[tx.ModelStatisticsResponse]) -> tx.ModelStatisticsResponse:
    """The statistics of several endpoints as one: per model and version, counts and
    durations summed, ``last_inference`` the latest, batch statistics summed per batch
    size, response statistics per key, memory usage per (type, id)."""
    if len(parts) == 1:
        return parts[0]
    out = tx.ModelStatisticsResponse()
    index: dict[tuple[str, str], tx.ModelStatistics] = {}
    for part in parts:
        for s in part.model_stats:
            acc = index.get((s.name, s.version))
            if acc is None:
                acc = out.model_stats.add()
                acc.CopyFrom(s)
                index[(s.name, s.version)] = acc
                continue
            acc.last_inference = max(acc.last_inference, s.last_inference)
            acc.inference_count = _add(acc.inference_count, s.inference_count, "inference_count")
            acc.execution_count = _add(acc.execution_count, s.execution_count, "execution_count")
            _add_durations(acc.inference_stats, s.inference_stats)
            batches = _keyed(acc.batch_stats, lambda b: b.batch_size)
            for b in s.batch_stats:
                if b.batch_size in batches:
                    _add_durations(batches[b.batch_size], b)
                else:
                    acc.batch_stats.add().CopyFrom(b)
            memory = _keyed(acc.memory_usage, lambda m: (m.type, m.id))
            for mu in s.memory_usage:
                if (mu.type, mu.id) in memory:
                    held = memory[(mu.type, mu.id)]
                    held.byte_size = _add(held.byte_size, mu.byte_size, "memory_usage.byte_size")
                else:
                    acc.memory_usage.add().CopyFrom(mu)
            for key, rs in s.response_stats.items():
                if key in acc.response_stats:
                    _add_durations(acc.response_stats[key], rs)
                else:
                    acc.response_stats[key].CopyFrom(rs)
    return out
