"""The one error a command reports (as one line, with exit code 1)."""


class CliError(Exception):
    """A failure to report as one line."""
