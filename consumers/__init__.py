"""What reads projections: the CLI, change-stream subscribers, query API and views."""
