"""REST API (DRF) for the Event log (read only)."""
