"""Benchmarks for tensordsl (see run_cpu.py)."""
