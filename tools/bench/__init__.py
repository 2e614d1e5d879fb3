"""Kernel benchmarks under the benchmark protocol (docs/benchmarking.md)."""
