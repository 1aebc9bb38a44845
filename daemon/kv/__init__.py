"""The KV layer's loop: programs paused and restored across workers (ThunderAgent)."""
