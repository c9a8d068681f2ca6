"""Deployment artefacts (deploy/) checked by the real tools: docker, helm, kubernetes schemas, Prometheus."""
