"""The vLLM engine for agentd workers.

Import `daemon.engines.vllm.engine.VllmEngine` explicitly: importing it loads
vLLM and torch (seconds), which a daemon without vLLM workers should not pay.
"""
