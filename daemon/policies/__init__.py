"""Operator-written scheduling policies: stored versions, validation, hot swap, rollback."""
