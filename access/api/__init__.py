"""REST API (DRF) for API tokens."""
