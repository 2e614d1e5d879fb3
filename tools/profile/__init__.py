"""Launchers and summaries for Nsight Compute profiles."""
