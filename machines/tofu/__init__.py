"""OpenTofu for terraform providers: the HTTP state backend the console keeps (backend.py, http.py) and the runner
that calls the configured binary in one directory per workspace (runner.py)."""
