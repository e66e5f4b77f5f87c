"""The host's own flows and their steps, the repair ladder and warm hosts."""
