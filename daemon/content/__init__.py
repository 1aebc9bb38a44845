"""Content-level tracing, opt-in per tenant: what requests said and answered, stored with
them (capture), their token totals and cost (usage), and a session's exports."""
