"""Load benchmark of oip-gateway against Triton direct and nginx (see benchmarks/README.md).

Run with ``bash benchmarks/run.sh`` (sets up everything) or ``.venv/bin/python -m benchmarks.run``.
"""
