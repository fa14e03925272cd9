"""Corpora for measuring a secret detector: real-format secrets, hard negatives, real text."""
