"""History that outlives the browser: the daemon samples its own series into the store
(sampler.py, on a timer: service.py), rolls them up and prunes them by tier (tiers.py,
done in the store: db/history_store.py), and keeps an operator event log derived from the
facts it traces (events.py). GET /v1/history and /v1/events read them
(daemon/api/history_api.py)."""
