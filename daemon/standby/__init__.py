"""A standby daemon: `agentd start --standby` on the same PostgreSQL store as the active
one answers 503 until the active one's store lease lapses, then takes over (db/lease.py)."""
