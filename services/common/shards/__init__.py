"""What both coordinators build on (Kafka's coordinator-common module): the
shard runtime that owns internal-topic partitions and replays each into a
shard, and the coordinator-epoch record that says who owns a partition.
Not to be confused with services/coordinator/, the transaction coordinator."""
