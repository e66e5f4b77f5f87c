"""REST API (DRF) for node claims."""
