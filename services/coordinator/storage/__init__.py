"""The coordinator's ports to durable state (internal topics on the partition store)."""
