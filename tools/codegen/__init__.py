"""Code generators for the CUDA sources."""
