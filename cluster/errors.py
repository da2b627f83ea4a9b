"""The cluster control plane's errors: a shallow hierarchy, each class says when it is raised.

Retriable ones say so: a caller that gets ``EtcdUnavailable`` or ``NotController`` may try again
later (after etcd comes back; against the new controller). Misuse raises the usual ``ValueError``.
"""

from __future__ import annotations


class ClusterError(Exception):
    """Base of the cluster control plane's errors."""

    retriable = False


class EtcdUnavailable(ClusterError):
    """Raised when no etcd endpoint answered a request in time (retriable: the data path keeps
    its last known assignment; metadata changes wait for etcd)."""

    retriable = True


class EtcdError(ClusterError):
    """Raised when etcd answered with an error (a request it refused, not one it never got)."""


class BrokerIdInUse(ClusterError):
    """Raised when a broker registers an id another live registration holds (its lease has not
    expired): two brokers must never share an id."""


class NotController(ClusterError):
    """Raised when a controller write is refused because the controller key's create revision is
    no longer this controller's epoch (it was deposed: its lease expired or was revoked), or when
    a caller that is not the controller asks for a controller write (retriable elsewhere)."""

    retriable = True


class MetadataConflict(ClusterError):
    """Raised when a controller write's other compare failed: the topic already exists, or a
    partition's assignment changed since it was read (read again and decide again)."""


class NoLiveBrokers(ClusterError):
    """Raised when partitions must be placed and no broker is registered."""


class NotEnoughBrokers(ClusterError):
    """Raised when a topic's replication factor asks for more replicas than brokers are live
    (Kafka's INVALID_REPLICATION_FACTOR): nothing is written."""


class ClusterKeyMismatch(ClusterError):
    """Raised when a broker would join a cluster whose brokers run with another auth mode or
    another CURVE server key (clients give one server key for the whole cluster)."""


class ClusterIdentityMismatch(ClusterError):
    """Raised when a broker's data directory belongs to another cluster (another name, or another
    etcd: a wrong endpoint, a rebuilt etcd) than the one it would join: joining would make it drop
    every topic of its own that the other cluster does not know."""


class InvalidReassignment(ClusterError):
    """Raised when a partition reassignment names no broker, a broker twice, a broker that is not
    registered (live), or a partition the topic does not have (Kafka's
    INVALID_REPLICA_ASSIGNMENT / UNKNOWN_TOPIC_OR_PARTITION): nothing is written."""
