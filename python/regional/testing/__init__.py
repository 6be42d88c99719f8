"""Real servers for tests and benchmarks: a Kafka broker (and later PostgreSQL), started and stopped here."""
