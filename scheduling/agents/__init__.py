"""NALAR's agent control: routing agent calls across instances, local controllers, policies."""
