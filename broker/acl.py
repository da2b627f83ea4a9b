"""Authorization: who may do what to which topics (``tailrace acl``), with ``--auth curve``.

Rules live in ``<data-dir>/auth/acls.json``, written atomically by ``tailrace acl add|remove``
on the broker's host (write access to the data directory is the proof of being its operator,
as Kafka's ZooKeeper-backed ``kafka-acls`` once was), and re-read by the router and the workers
when the file changes (every heartbeat). A rule allows one principal (a key's name in the
allow-list) some operations on topics named exactly, by prefix, or all (``*``):

    produce  PRODUCE                          consume  FETCH
    create   CREATE_TOPIC                     describe DESCRIBE_TOPIC, LIST_OFFSETS, LIST_TOPICS (filtered)
    admin    STATUS, SET_WORKERS              alter    CREATE_PARTITIONS, ALTER_CONFIGS
    delete   DELETE_TOPIC                     group    the group ops on the group named (LIST_GROUPS: admin)
    share    the share-group ops on the share group named (LIST_SHARE_GROUPS: admin); SHARE_FETCH
             also needs consume on each topic it reads (the share coordinator checks)

(each op's row in client/ops.py says which; an op with no need there does not import, and the
internal ops, PING and ADOPT, are refused to every client). An op that names nothing in its
routing header needs its operation on anything: LIST_TOPICS is refused to a principal that may
describe no topic, and lists only what it may describe otherwise.

As in Kafka, produce, consume, alter and delete on a topic each allow describing it: a producer
that may write a topic may learn its partitions. A refusal names what the request was for
(``may not produce to topic 'events'``, ``may not use group 'gg'``). Group rules match the
group's name, not a topic's: a consumer in group ``orders.billing`` needs ``group`` on a rule
covering ``orders.billing`` as well as ``consume`` on its topics.

With no rule at all, authorization is off: every authenticated principal may do everything
(the quick start works; the first ``acl add`` turns it on). With rules, whatever no rule allows
is refused with ``NOT_AUTHORIZED`` and changes nothing. Without ``--auth`` nothing is checked.
"""

from __future__ import annotations

import json
import os

import msgspec

from tailrace.client import ops
from tailrace.client import protocol as P

from . import datadir
from .auth import BROKER_PREFIX

ACL_FILE = datadir.ACL_FILE
OPERATIONS = ("produce", "consume", "create", "delete", "alter", "describe", "group", "share", "admin")
ALL_TOPICS = "*"
# what a refusal says the principal may not do, per operation: the request's own words
REFUSALS = {"produce": "produce to topic {name!r}", "consume": "consume from topic {name!r}",
            "create": "create topic {name!r}", "delete": "delete topic {name!r}", "alter": "alter topic {name!r}",
            "describe": "describe topic {name!r} (no rule gives it produce, consume, describe, alter or delete there)",
            "group": "use group {name!r}", "share": "use share group {name!r}", "admin": "administer the broker"}
assert set(REFUSALS) == set(OPERATIONS)
LIST_REFUSAL = "list topics (no rule gives it produce, consume, describe, alter or delete on any topic)"
# Kafka's rule: each of these on a topic allows DESCRIBE on it too (a producer learns where to send)
IMPLY_DESCRIBE = ("describe", "produce", "consume", "alter", "delete")


def check_needs(spec) -> dict[int, str]:
    """op -> the operation it needs, from the op spec (client/ops.py); raises ImportError for a
    client-facing op whose need is not one of OPERATIONS, so access control fails closed: an op
    that nobody said who may use does not exist in a running broker."""
    needs = {}
    for row in spec:
        if row.served == ops.INTERNAL:
            continue
        if row.acl not in OPERATIONS:
            raise ImportError(f"op {row.op.name} ({int(row.op)}) needs acl={row.acl!r}: each client-facing op "
                              f"needs one of {', '.join(OPERATIONS)} (client/ops.py SPEC)")
        if (row.acl in ("group", "share")) != (row.names == ops.GROUP):
            raise ImportError(f"op {row.op.name}: the group and share operations are for ops that name a group, and they need one")
        needs[row.op] = row.acl
    return needs


# op -> the operation it needs (every client-facing op; internal ones are refused to clients)
OP_NEEDS = check_needs(ops.SPEC)
# op -> (need, the routing topic's meaning), for refusal_for: one dict lookup per request
_CHECKS = {row.op: (row.acl, row.names) for row in ops.SPEC}


def is_broker(principal: str) -> bool:
    """A cluster's broker asking another (auth.BROKER_PRINCIPAL): Kafka's inter-broker super user.
    No allow-list file can name it (a key's name is a file name, without '/')."""
    return principal.startswith(BROKER_PREFIX)


class Rule(msgspec.Struct, frozen=True):
    principal: str
    pattern: str  # a topic name, a prefix, or "*"
    match: str  # "exact" | "prefix"
    ops: tuple[str, ...]

    def covers(self, topic: str) -> bool:
        if self.pattern == ALL_TOPICS:
            return True
        return topic.startswith(self.pattern) if self.match == "prefix" else topic == self.pattern


class AclFile(msgspec.Struct):
    rules: list[Rule] = []


def acl_path(data_dir: str) -> str:
    return os.path.join(data_dir, datadir.AUTH_DIR, ACL_FILE)


def read_rules(data_dir: str) -> list[Rule]:
    try:
        with open(acl_path(data_dir), "rb") as f:
            return decode_rules(f.read())
    except FileNotFoundError:
        return []


def _write(data_dir: str, rules: list[Rule]) -> None:
    os.makedirs(os.path.dirname(acl_path(data_dir)), mode=0o700, exist_ok=True)
    body = encode_rules(rules)
    path = acl_path(data_dir)  # private as its directory (0600 in a 0700 one), whatever the operator's umask
    datadir.write_atomic(path, body, mode=datadir.file_mode_in(os.path.dirname(path)))


def check_rule(principal: str, pattern: str, match: str, ops) -> Rule:
    ops = tuple(dict.fromkeys(o.strip() for o in ops if o.strip()))
    bad = [o for o in ops if o not in OPERATIONS]
    if bad or not ops:
        raise ValueError(f"operations {bad or '(none)'}: each one of {', '.join(OPERATIONS)}")
    if not principal or not pattern or match not in ("exact", "prefix"):
        raise ValueError("a rule needs a principal, a topic (or prefix, or *) and exact or prefix")
    return Rule(principal, pattern, "prefix" if pattern == ALL_TOPICS else match, ops)


def with_rule(rules: list[Rule], rule: Rule) -> list[Rule] | None:
    """``rules`` with ``rule`` added; None if it is there already. (The file here and a cluster's
    etcd key, cluster/access.py, are changed by the same two functions.)"""
    return None if rule in rules else [*rules, rule]


def without_rule(rules: list[Rule], rule: Rule) -> list[Rule] | None:
    """``rules`` without ``rule``; None if it is not there."""
    return [r for r in rules if r != rule] if rule in rules else None


def encode_rules(rules: list[Rule]) -> bytes:
    return json.dumps({"rules": [msgspec.to_builtins(r) for r in rules]}, indent=1).encode()


def decode_rules(body: bytes) -> list[Rule]:
    return msgspec.json.decode(body, type=AclFile).rules


def write_rules(data_dir: str, rules: list[Rule]) -> None:
    _write(data_dir, rules)


def add_rule(data_dir: str, rule: Rule) -> bool:
    """Add ``rule`` (False if the same rule is there already)."""
    rules = with_rule(read_rules(data_dir), rule)
    if rules is not None:
        _write(data_dir, rules)
    return rules is not None


def remove_rule(data_dir: str, rule: Rule) -> bool:
    rules = without_rule(read_rules(data_dir), rule)
    if rules is not None:
        _write(data_dir, rules)
    return rules is not None


class Acls:
    """The rules as a process checks them, re-read when the file changes (``refresh``)."""

    def __init__(self, data_dir: str):
        self.path = acl_path(data_dir)
        self.data_dir = data_dir
        self.rules: list[Rule] = []
        self._seen = None
        self.refresh()

    def refresh(self) -> None:
        sig = datadir.file_signature(self.path)
        if sig == self._seen:
            return
        try:
            self.rules = read_rules(self.data_dir)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            self.rules = [Rule("", "", "exact", ())]  # unreadable: deny everything rather than allow it
        self._seen = sig

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    def allows(self, principal: str, operation: str, topic: str) -> bool:
        if not self.rules:
            return True
        return any(r.principal == principal and operation in r.ops and r.covers(topic) for r in self.rules)

    def may_describe(self, principal: str, topic: str) -> bool:
        """DESCRIBE on ``topic``, given by any operation that implies it (``IMPLY_DESCRIBE``)."""
        return any(self.allows(principal, o, topic) for o in IMPLY_DESCRIBE)

    def allows_any(self, principal: str, operation: str) -> bool:
        return not self.rules or any(r.principal == principal and operation in r.ops for r in self.rules)

    def refusal_for(self, principal: str, op: int, topic: bytes) -> str | None:
        """Why ``principal`` may not make request ``op`` on ``topic`` (None: it may), in the words
        of what the request was for (``REFUSALS``). An internal op is refused whatever the rules;
        an op id not in the spec passes (nothing to authorize: the endpoint answers UNKNOWN_OP)."""
        check = _CHECKS.get(op)
        if check is None or not self.rules or is_broker(principal):
            return None
        need, names = check
        if need == ops.INTERNAL:
            return f"op {P.Op(op).name} ({op}) is internal: router to worker only"
        name = topic.decode("utf-8", "replace")
        if names == ops.NOTHING:  # names no resource: its operation anywhere (LIST_TOPICS then lists what it may describe)
            wanted = IMPLY_DESCRIBE if need == "describe" else (need,)
            ok = any(r.principal == principal and any(o in r.ops for o in wanted) for r in self.rules)
            return None if ok else f"principal {principal!r} may not " + (LIST_REFUSAL if need == "describe" else REFUSALS[need])
        if need == "describe":  # Kafka's implied DESCRIBE: a client finds what it may use
            ok = self.may_describe(principal, name)
        else:
            ok = self.allows(principal, need, name)
        return None if ok else f"principal {principal!r} may not " + REFUSALS[need].format(name=name)
