"""The core: in-memory state of workers, programs and requests, applying scheduling
decisions, recovery at start, program lineage and tenants."""
