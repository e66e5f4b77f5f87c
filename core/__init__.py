"""The leaf of the console: what every app uses and that is about no domain. Imports no app."""
