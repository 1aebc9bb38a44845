"""Models agentd can fetch and prepare for its engines without a model hub."""

from daemon.models.smollm2 import DEFAULT_SMOLLM2_DIR, FetchError, fetch_command, fetch_smollm2

__all__ = ["DEFAULT_SMOLLM2_DIR", "FetchError", "fetch_command", "fetch_smollm2"]
