"""GPU checks: one call runs a path's GPU tests and measurements and leaves logs in a folder."""
