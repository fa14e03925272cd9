"""Where projections live: PostgreSQL (durable, queryable) and Redis (hot views)."""
