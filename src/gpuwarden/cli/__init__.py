"""The command line: one module per verb group; each parses, calls, renders."""
