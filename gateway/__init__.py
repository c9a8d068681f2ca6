"""oip-gateway: a stateless front door for Open Inference Protocol (KServe V2) servers."""
__version__ = "0.1.0"
__all__ = ["__version__"]
