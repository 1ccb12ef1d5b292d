"""Migration between tiers: Pafka's threshold policy and the service that applies it."""
