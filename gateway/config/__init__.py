"""Configuration: frozen dataclasses (schema, and by section: network, backends, routes, security, v1)
and the YAML loader."""
from .backends import DEFAULT_MAX_MESSAGE_BYTES, BackendSpec
from .loader import load_config, parse_config
from .network import BackendTls, HostPort, Listen, Tls
from .routes import Route
from .schema import GatewayConfig, Health

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "BackendSpec",
    "BackendTls",
    "GatewayConfig",
    "Health",
    "HostPort",
    "Listen",
    "Route",
    "Tls",
    "load_config",
    "parse_config",
]
