"""``tailrace partitions reassign`` and ``tailrace cluster decommission``: moving a cluster's
partition replicas between brokers (Kafka's kafka-reassign-partitions, KIP-455).

Both go through the Admin client (ALTER_PARTITION_REASSIGNMENTS, docs/PROTOCOL.md 4.7d'), so any
broker of the cluster may be the bootstrap: the request follows NOT_CONTROLLER to the controller,
which adds the new replicas at once and finishes each move once they are in sync (docs/DESIGN.md
"Replication", Reassignment). ``--wait`` polls DESCRIBE_TOPIC (any broker answers for the whole
cluster) until the moves are done, printing each change it sees: a move takes as long as its new
replicas take to copy the partition.

decommission empties a broker before it is stopped: each partition that lists it is moved to a
live broker it does not list yet, the one holding fewest replicas (counted as the moves under way
will leave them), in the broker's place (so a preferred leader's replacement is preferred), and
with ``--wait`` it returns once no partition lists the broker.
"""

from __future__ import annotations

import argparse
import sys
import time

from tailrace import console
from tailrace.client.admin import Admin
from tailrace.console import EXIT_ERROR, EXIT_OK

POLL_S = 0.5  # --wait describes the topics this often
INT32_MAX = (1 << 31) - 1  # broker ids and partitions are int32 on the wire, as Kafka's

_broker_id = console.int_at_least(0, "a broker id", maximum=INT32_MAX)
_partition = console.int_at_least(0, maximum=INT32_MAX)  # one the topic lacks: the broker's UNKNOWN_PARTITION
_wait_s = console.float_above(0.0, maximum=365 * 86400.0)


def _broker_list(text: str) -> list[int]:
    """``--replicas 2,0,1``: broker ids, the first the preferred leader (duplicates are the
    broker's to refuse, with the rest of its checks)."""
    parts = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: broker ids separated by commas, e.g. 2,0,1")
    return [_broker_id(t) for t in parts]


def _ids(ids) -> str:
    return ",".join(map(str, ids)) or "-"


def _open(args) -> Admin:
    return Admin(args.bootstrap, connect_timeout_ms=args.connect_timeout_ms, key_file=args.key_file,
                 server_key=args.server_key)


def add_parsers(sub, cluster_sub, command, with_bootstrap) -> None:
    """``partitions reassign`` (a command group of its own) and ``cluster decommission``, on the
    parsers tailrace/cli.py builds (``command`` and ``with_bootstrap`` are its helpers)."""
    pa = command(sub, "partitions", "move a cluster's partition replicas between brokers (Kafka's "
                                    "kafka-reassign-partitions)")
    psub = pa.add_subparsers(dest="partitions_cmd", required=True, metavar="SUBCOMMAND")
    ra = with_bootstrap(command(psub, "reassign", "move one partition's replicas to these brokers: the new ones copy "
                                                  "the leader, then the old ones are dropped (and leadership moves if "
                                                  "its leader is not among them)"))
    ra.add_argument("name", metavar="TOPIC", help="topic name")
    ra.add_argument("--partition", type=_partition, required=True, metavar="P", help="the partition to move")
    ra.add_argument("--replicas", type=_broker_list, required=True, metavar="ID[,ID...]",
                    help="the broker ids to hold it, the preferred leader first (e.g. 2,0,1)")
    ra.add_argument("--wait", type=_wait_s, default=None, metavar="SECONDS",
                    help="wait this long for the move to finish, printing its progress (default: return once started)")
    pa.set_defaults(func=cmd_partitions)

    de = with_bootstrap(command(cluster_sub, "decommission", "move every replica off a broker (each to the live broker "
                                                             "holding fewest that does not hold it yet), so it can be "
                                                             "stopped"))
    de.add_argument("broker", type=_broker_id, metavar="BROKER_ID", help="the broker to empty")
    de.add_argument("--wait", type=_wait_s, default=None, metavar="SECONDS",
                    help="wait this long until no partition lists the broker, printing progress (default: return "
                         "once the moves are started)")
    de.set_defaults(func=cmd_decommission)


# --- partitions reassign -----------------------------------------------------------------------
def cmd_partitions(args) -> int:
    return reassign(args)  # the one subcommand so far


def reassign(args) -> int:
    name, p, target = args.name, args.partition, args.replicas
    with _open(args) as admin:
        (r,) = admin.reassign_partitions(name, {p: target})
        if not r.target and r.replicas == target:
            print(f"partition {name}/{p}: replicas {_ids(r.replicas)} already: nothing to move")
            return EXIT_OK
        print(f"partition {name}/{p}: moving to replicas {_ids(target)}: replicas {_ids(r.replicas)}, "
              f"isr {_ids(r.isr)}, leader {r.leader}", flush=True)
        info = next((x for x in admin.describe_topic(name).partitions if x.partition == p), None)
        if info is not None and info.log_start_offset > 0 and set(target) - set(r.isr):
            print(f"tailrace partitions reassign: warning: partition {name}/{p} starts at offset "
                  f"{info.log_start_offset}: a new replica's copy starts at 0 and cannot catch up yet, so this move "
                  "will not finish (docs/DESIGN.md, Reassignment)", file=sys.stderr)
        if args.wait is None:
            print("the new replicas are copying; the move finishes once they are in sync "
                  f"(tailrace topic describe {name} shows it; --wait SECONDS waits for it)")
            return EXIT_OK
        left = _wait(admin, {name: {p: target}}, args.wait)
    if left:
        print(f"tailrace partitions reassign: partition {name}/{p} not moved within {args.wait:g} s "
              f"({left[0]}); the move goes on", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _wait(admin, moves: dict[str, dict[int, list[int]]], timeout_s: float) -> list[str]:
    """Describe the topics of ``moves`` every POLL_S until each partition's replicas are its
    target with nothing pending, printing each change; what is left when ``timeout_s`` passes
    (empty: all done)."""
    t0 = time.monotonic()
    seen: dict[tuple[str, int], tuple] = {}
    while True:
        left = []
        for name, targets in sorted(moves.items()):
            parts = {x.partition: x for x in admin.describe_topic(name).partitions}
            for p, target in sorted(targets.items()):
                x = parts[p]
                now = (tuple(x.replicas), tuple(x.isr), x.leader, tuple(x.target))
                done = list(x.replicas) == target and not x.target
                if seen.get((name, p)) != now:
                    seen[(name, p)] = now
                    print(f"{time.monotonic() - t0:6.1f} s  {name}/{p}: replicas {_ids(x.replicas)}  "
                          f"isr {_ids(x.isr)}  leader {x.leader} (epoch {x.leader_epoch})"
                          + ("  done" if done else _pending(x, target)), flush=True)
                if not done:
                    left.append(f"{name}/{p}: replicas {_ids(x.replicas)}, isr {_ids(x.isr)}"
                                + (f", moving to {_ids(x.target)}" if x.target else ""))
        if not left or time.monotonic() - t0 > timeout_s:
            return left
        time.sleep(POLL_S)


def _pending(x, target: list[int]) -> str:
    if x.target and list(x.target) != target:
        return f"  (another reassignment, to {_ids(x.target)}, replaced this one)"
    behind = [b for b in target if b not in x.isr]
    return f"  (waiting for {_ids(behind)} to catch up)" if behind else "  (finishing)"


# --- cluster decommission ----------------------------------------------------------------------
def cmd_decommission(args) -> int:
    where, n = "tailrace cluster decommission", args.broker
    with _open(args) as admin:
        cl = admin.status().get("cluster") or {}
        if not cl:
            print(f"{where}: the broker at {args.bootstrap} is a single host: there is nothing to move", file=sys.stderr)
            return EXIT_ERROR
        live = sorted(int(b) for b in cl.get("brokers", {}))
        if n not in live:
            print(f"{where}: note: broker {n} is not registered (down): a partition only it held cannot be copied "
                  "until it is back", file=sys.stderr)
        described = {t.name: admin.describe_topic(t.name) for t in admin.list_topics()}
        moves, stuck = plan(described, n, live)
        if stuck:
            for name, p, heading in stuck:
                print(f"{where}: partition {name}/{p} (replicas {_ids(heading)}): no live broker outside its "
                      f"replicas can take broker {n}'s place", file=sys.stderr)
            print(f"{where}: nothing moved; add a broker first (live: {_ids(live)})", file=sys.stderr)
            return EXIT_ERROR
        by_topic: dict[str, dict[int, list[int]]] = {}
        for name, p, heading, new in moves:
            by_topic.setdefault(name, {})[p] = new
        for name, targets in sorted(by_topic.items()):
            admin.reassign_partitions(name, targets)
        for name, p, heading, new in moves:
            print(f"{name}/{p}: replicas {_ids(heading)} -> {_ids(new)}", flush=True)
        waiting = listing(described, n)
        if not waiting:
            print(f"broker {n} holds no replica: it can be stopped")
            return EXIT_OK
        if args.wait is None:
            print(f"{len(waiting)} partitions are moving off broker {n}; --wait SECONDS waits until none lists it")
            return EXIT_OK
        t0, last = time.monotonic(), None
        while True:
            waiting = listing({name: admin.describe_topic(name) for name in described}, n)
            if waiting != last:
                last = waiting
                print(f"{time.monotonic() - t0:6.1f} s  {len(waiting)} partitions list broker {n}"
                      + (f": {', '.join(waiting[:8])}{' ...' if len(waiting) > 8 else ''}" if waiting else ""), flush=True)
            if not waiting:
                print(f"broker {n} holds no replica: it can be stopped")
                return EXIT_OK
            if time.monotonic() - t0 > args.wait:
                print(f"{where}: {len(waiting)} partitions still list broker {n} after {args.wait:g} s: "
                      f"{', '.join(waiting[:8])}; the moves go on", file=sys.stderr)
                return EXIT_ERROR
            time.sleep(POLL_S)


def plan(described: dict, n: int, live: list[int]) -> tuple[list, list]:
    """The moves that take broker ``n`` out of every partition's replicas (as each is heading:
    its pending target, else its replicas): ``[(topic, partition, heading, new)]``, each new
    broker the live one holding fewest replicas (as the moves leave them, ties to the lower id)
    that the partition does not list; and the partitions no live broker can take (``stuck``)."""
    counts = {b: 0 for b in live if b != n}
    for d in described.values():
        for x in d.partitions:
            for b in (x.target or x.replicas):
                if b in counts:
                    counts[b] += 1
    moves, stuck = [], []
    for name, d in sorted(described.items()):
        for x in d.partitions:
            heading = list(x.target or x.replicas)
            if n not in heading:
                continue
            free = [b for b in counts if b not in heading]
            if not free:
                stuck.append((name, x.partition, heading))
                continue
            pick = min(free, key=lambda b: (counts[b], b))
            counts[pick] += 1
            moves.append((name, x.partition, heading, [pick if b == n else b for b in heading]))
    return moves, stuck


def listing(described: dict, n: int) -> list[str]:
    """``topic/partition`` of every partition whose replicas (or pending target) list ``n``."""
    return [f"{name}/{x.partition}" for name, d in sorted(described.items()) for x in d.partitions
            if n in x.replicas or n in x.target]
