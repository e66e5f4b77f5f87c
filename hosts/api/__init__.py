"""REST API (DRF) for bare-metal hosts."""
