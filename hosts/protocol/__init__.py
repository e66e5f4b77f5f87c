"""The agent protocol: the agent's API, its long poll and the listener that serves them."""
