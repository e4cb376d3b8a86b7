"""Engines: what runs a batch. They see sessions and tokens, never queues or budgets."""
