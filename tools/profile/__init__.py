"""Developer tools of mixgemm (run from the repository root: python -m tools.<group>.<name>)."""
