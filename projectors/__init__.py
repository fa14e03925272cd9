"""The five projections as pure folds ``(entry, state) -> state``, plus their stores."""
