"""Settings of the REST API and web security (kept apart so that they are read in one place)."""
