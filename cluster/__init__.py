"""A cluster of brokers on etcd: the control plane (docs/DESIGN.md "Cluster (control plane)").

Opt-in: nothing on a single host imports this package, and only ``cluster/etcd.py`` imports the
etcd client (the ``cluster`` extra installs it). Modules: ``etcd`` (the client wrapper),
``etcd_server`` (a loopback etcd for tests and dev), ``metadata`` (every key and value schema),
``membership`` (registration under a lease, the fence), ``assign`` (placement, pure),
``controller`` (election, fenced writes, placement and reassignment), ``errors``.
"""
