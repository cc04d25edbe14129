"""Replication on one store node, both sides in one place (docs/replication.md).

* fetcher.py: the follower side, Kafka's ReplicaFetcherManager: one
  LeaderFetcher per store this node follows partitions of.
* serving.py, sessions.py: the leader side: followers' fetches, their fetch
  sessions, and what they move (the high watermark, the ISR).
* metadata_link.py: the cluster's view in the metadata store and the
  controller.
* controlled_shutdown.py: handing leaderships over before a store stops."""
