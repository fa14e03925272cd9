"""Local Kafka/PostgreSQL/Redis bring-up, settings, topic and table migrations."""
