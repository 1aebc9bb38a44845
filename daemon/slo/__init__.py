"""The SLO stack: tagging, queues, the meta loop and its exposition (H-MAS)."""
