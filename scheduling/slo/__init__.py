"""H-MAS's SLO scheduling: tagging, prediction, ordering, views, meta, admission."""
