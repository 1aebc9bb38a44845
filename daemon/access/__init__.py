"""Who may do what: tokens and their scopes (auth), tenant names. The tenancy rule itself
(a caller sees its own tenant's objects only) is daemon/api/tenants.py."""
