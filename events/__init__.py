"""The Event log: one append-only record of every change, step and action, read by audit, timelines and
the live views."""
