"""The step engine: flows of steps, driven level-triggered and resumable on the host row."""
