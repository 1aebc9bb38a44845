"""The tool service: tool containers held by programs, their clock and metrics."""
