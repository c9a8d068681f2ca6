"""Metrics and access logging."""
from .metrics import UNROUTED, Metrics

__all__ = ["UNROUTED", "Metrics"]
