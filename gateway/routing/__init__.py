"""Pure routing decisions: the route table and endpoint balancing."""
from .balancer import RoundRobin
from .table import Match, RouteTable

__all__ = ["Match", "RoundRobin", "RouteTable"]
