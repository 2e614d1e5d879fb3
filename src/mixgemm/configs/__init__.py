"""Shipped per-GPU dispatch tables (JSON), read by mixgemm.ops.configs."""
