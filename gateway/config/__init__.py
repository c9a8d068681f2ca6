"""Configuration: frozen dataclasses (schema) and the YAML loader."""
from .loader import load_config, parse_config
from .schema import DEFAULT_MAX_MESSAGE_BYTES, Backend, BackendTls, GatewayConfig, Health, HostPort, Listen, Route, Tls

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Backend",
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
