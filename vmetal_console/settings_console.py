"""Settings of the web console and its live updates (Channels)."""
