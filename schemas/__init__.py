"""The ledger contract: Avro schemas (every version kept), pydantic models and the codec."""
