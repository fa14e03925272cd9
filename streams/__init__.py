"""Kafka topology: topics, the faust app and workers, the fleet publisher, dead letters, replay."""
