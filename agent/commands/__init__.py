"""The agent's commands, one module each: `base` (Context, CommandError), the command modules, and `registry`
(the commands by name, and `execute`, which runs one without HTTP). Nothing is imported here."""
