"""The cluster's metadata: the layout (who exists, who owns what), the
metadata store port with its etcd and in-memory adapters, and the
coordinators' cache of topic partition counts."""
