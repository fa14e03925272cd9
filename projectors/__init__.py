"""The six projections as pure folds ``(state, entry) -> state``, and their stores
(``projectors.stores``: the store contract and its PostgreSQL, Redis and in-memory backends)."""
