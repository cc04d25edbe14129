"""oncelog: a transactional, partitioned log with exactly-once semantics."""
