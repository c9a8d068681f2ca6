"""Conversion benchmark: the gateway's CPU time, peak memory and latency per conversion path.

Run ``.venv/bin/python -m benchmarks.conversion [--quick | --profile]``; see README.md.
"""
