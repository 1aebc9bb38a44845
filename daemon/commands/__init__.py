"""The command line: `agentd start|worker|token|calibrate|replay` and their helpers."""
