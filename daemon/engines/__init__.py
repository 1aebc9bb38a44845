"""Engine workers: the process that wraps one engine (vLLM or simulated) and speaks the protocol."""
