"""Pure routing decisions: the route table, endpoint balancing, per-endpoint readiness and
ejection state, the retry budget."""
from .balancer import LeastRequest, RoundRobin
from .readiness import EndpointHealth, Ready
from .retry import RetryBudget
from .table import Match, RouteTable

__all__ = ["EndpointHealth", "LeastRequest", "Match", "Ready", "RetryBudget", "RoundRobin", "RouteTable"]
