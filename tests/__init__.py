"""Unit (pure), contract, integration (real services) and end-to-end tests."""
