"""Cluster-wide access control in etcd: the allow-list of client keys, the ACL rules and the quotas.

On a single host these live in files under ``<data-dir>/auth`` (broker/auth.py, broker/acl.py,
broker/quota.py). In a cluster the operator writes them once, to etcd (``tailrace keys allow``,
``tailrace acl``, ``tailrace quota`` with ``--cluster etcd://...``), under
``/tailrace/<c>/access/`` (cluster/metadata.py), and every broker's router mirrors them into its
own data directory as it watches (router/cluster_agent.py): the router's and the workers' checks
are the single host's, re-reading their files within a second. While etcd is unreachable each
broker keeps enforcing the last rules it mirrored.

Changes are read-modify-write, each a transaction comparing the key's mod revision with the one
read (two operators adding rules at once both land; neither overwrites the other). The rule
logic itself (what adding a rule twice does, a bad quota) is broker/acl.py's and
broker/quota.py's, shared with the files.
"""

from __future__ import annotations

import time
from typing import Callable

from tailrace.broker import acl as acl_mod
from tailrace.broker import auth as auth_mod
from tailrace.broker import quota as quota_mod

from .errors import EtcdUnavailable
from .etcd import Etcd, absent, mod_revision_is, put_op
from .metadata import Keys

CAS_TRIES = 20


class ClusterAccess:
    def __init__(self, etcd: Etcd, cluster: str):
        self.etcd = etcd
        self.keys = Keys(cluster)

    # --- one JSON key changed by compare-and-swap ---
    def _update(self, key: str, decode: Callable, encode: Callable, change: Callable):
        """``change(current)`` -> the new value, or None to leave it; retried on a concurrent
        write. Returns the new value (None: unchanged)."""
        for _ in range(CAS_TRIES):
            kv = self.etcd.get(key)
            new = change(decode(kv.value) if kv is not None else [])
            if new is None:
                return None
            guard = mod_revision_is(key, kv.mod_revision) if kv is not None else absent(key)
            if self.etcd.txn([guard], [put_op(key, encode(new))]).succeeded:
                return new
            time.sleep(0.05)
        raise EtcdUnavailable(f"{key}: {CAS_TRIES} concurrent changes in a row; try again")

    # --- ACL rules ---
    def rules(self) -> list[acl_mod.Rule]:
        kv = self.etcd.get(self.keys.acls)
        return acl_mod.decode_rules(kv.value) if kv is not None else []

    def add_rule(self, rule: acl_mod.Rule) -> bool:
        return self._update(self.keys.acls, acl_mod.decode_rules, acl_mod.encode_rules,
                            lambda rules: acl_mod.with_rule(rules, rule)) is not None

    def remove_rule(self, rule: acl_mod.Rule) -> bool:
        return self._update(self.keys.acls, acl_mod.decode_rules, acl_mod.encode_rules,
                            lambda rules: acl_mod.without_rule(rules, rule)) is not None

    # --- quotas ---
    def quotas(self) -> list[quota_mod.Quota]:
        kv = self.etcd.get(self.keys.quotas)
        return quota_mod.decode_quotas(kv.value) if kv is not None else []

    def set_quota(self, quota: quota_mod.Quota) -> None:
        self._update(self.keys.quotas, quota_mod.decode_quotas, quota_mod.encode_quotas,
                     lambda quotas: quota_mod.with_quota(quotas, quota))

    def remove_quota(self, principal: str) -> bool:
        return self._update(self.keys.quotas, quota_mod.decode_quotas, quota_mod.encode_quotas,
                            lambda quotas: quota_mod.without_quota(quotas, principal)) is not None

    # --- the allow-list ---
    def clients(self) -> dict[str, str]:
        """principal -> Z85 public key."""
        kvs, _ = self.etcd.get_prefix(self.keys.clients)
        return {kv.key[len(self.keys.clients):]: kv.value.decode("ascii") for kv in kvs}

    def allow(self, name: str, public_key: bytes) -> bool:
        """Allow the client key ``public_key`` (Z85) as principal ``name``; False if that name
        already holds that key. A name holding another key is refused (ValueError): revoke it first."""
        key = self.keys.client(auth_mod.check_principal_name(name))
        public_key = auth_mod.check_public_key(public_key).encode("ascii")
        r = self.etcd.txn([absent(key)], [put_op(key, public_key)], [])
        if r.succeeded:
            return True
        held = self.etcd.get(key)
        if held is not None and held.value == public_key:
            return False
        raise ValueError(f"principal {name!r} is allowed with another key already: revoke it first")

    def revoke(self, name: str) -> bool:
        return self.etcd.delete(self.keys.client(name)) > 0
