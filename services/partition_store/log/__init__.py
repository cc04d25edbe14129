"""One partition's log on a store node (Kafka's `kafka.log`): its state and
I/O (partition.py), recovery at open (loader.py), what it answers to reads
(reads.py), retention and compaction (cleaning.py) and the log cleaner's
pass (cleaner.py)."""
