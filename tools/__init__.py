"""mixgemm developer tools (tools/README.md): run from the repository root as python -m tools.<group>.<name>."""
