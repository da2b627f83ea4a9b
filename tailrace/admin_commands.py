"""``tailrace topic`` and ``tailrace groups``: topics and consumer groups through the Admin client.

topic creates, grows, reconfigures, deletes, lists and describes topics (Kafka's kafka-topics);
groups lists and describes consumer groups with their lag, resets and deletes their committed
offsets (kafka-consumer-groups). Each subcommand prints a table, or JSON with ``--json``.
"""

from __future__ import annotations

import sys

from tailrace.client.admin import Admin
from tailrace.client.errors import TailraceError
from tailrace.console import EXIT_OK, EXIT_USAGE
from tailrace.tables import as_builtins, human_bytes, print_json, print_table


def security(args) -> dict:
    """``--key-file`` and ``--server-key`` as client options (client/security.py)."""
    return {"key_file": args.key_file, "server_key": args.server_key}


def open_admin(args) -> Admin:
    """An Admin client to the broker ``--bootstrap`` names, with the command's timeout and keys."""
    return Admin(args.bootstrap, connect_timeout_ms=args.connect_timeout_ms, **security(args))


def cmd_topic(args) -> int:
    with open_admin(args) as admin:
        if args.topic_cmd == "create":
            info = admin.create_topic(args.name, args.partitions, args.ring_bytes, dict(args.config),
                                      args.replication_factor)
            if args.json:
                print_json(as_builtins(info))
            else:
                copies = f", {info.replication_factor} replicas each" if info.replication_factor > 1 else ""
                print(f"created topic {info.name} with {info.partitions} partitions{copies} (id {info.topic_id})")
        elif args.topic_cmd == "alter":
            if args.partitions is None and not args.config:
                print("tailrace topic alter: give --partitions N and/or --config NAME=VALUE", file=sys.stderr)
                return EXIT_USAGE
            before = next((t.partitions for t in admin.list_topics() if t.name == args.name), None)
            if args.config:
                info = admin.alter_configs(args.name, dict(args.config))
            if args.partitions is not None:
                info = admin.create_partitions(args.name, args.partitions)
            if args.json:
                print_json(as_builtins(info))
            else:
                if args.partitions is not None:
                    print(f"topic {info.name} now has {info.partitions} partitions (had {before}); keys may map to other "
                          "partitions from now on")
                if args.config:
                    print(f"topic {info.name} settings: " + ", ".join(f"{k}={v}" for k, v in sorted(info.config.items())))
        elif args.topic_cmd == "delete":
            info = admin.delete_topic(args.name)
            if args.json:
                print_json(as_builtins(info))
            else:
                print(f"deleted topic {info.name} ({info.partitions} partitions, id {info.topic_id})")
        elif args.topic_cmd == "list":
            topics = admin.list_topics(internal=args.internal)
            if args.json:
                print_json([as_builtins(t) for t in topics])
            else:
                print_table(["topic", "partitions", "ring bytes", "id"],
                            [[t.name, t.partitions, human_bytes(t.ring_bytes), t.topic_id] for t in topics])
        elif args.topic_cmd == "describe":
            d = admin.describe_topic(args.name)
            if args.json:
                doc = as_builtins(d)
                for p in doc["partitions"]:  # the broker's internal addresses are not the user's business
                    for k in ("endpoint", "local_endpoint", "slot", "adopted"):
                        p.pop(k, None)
                print_json({"topic": doc["topic"], "partitions": doc["partitions"]})
            else:
                cols = ["partition", "worker", "log start", "high watermark", "durable watermark", "ring use", "bytes"]
                rows = [[p.partition, p.worker, p.log_start_offset, p.high_watermark, p.durable_watermark,
                         _ring_use(p, d.topic.ring_bytes), human_bytes(getattr(p, "appended_bytes", 0))] for p in d.partitions]
                if d.broker_id >= 0:  # a cluster: who leads and who holds copies (Kafka's Leader, Replicas, Isr)
                    cols += ["leader", "epoch", "replicas", "isr"]
                    for row, p in zip(rows, d.partitions):
                        row += [p.leader if p.leader >= 0 else "none", p.leader_epoch,
                                ",".join(map(str, p.replicas)), ",".join(map(str, p.isr))]
                    if any(p.target for p in d.partitions):  # a reassignment under way (tailrace partitions reassign)
                        cols.append("moving to")
                        for row, p in zip(rows, d.partitions):
                            row.append(",".join(map(str, p.target)) or "-")
                copies = f", replication factor {d.topic.replication_factor}" if d.broker_id >= 0 else ""
                print_table(cols, rows,
                            title=f"topic {d.topic.name}: {d.topic.partitions} partitions{copies}, ring {human_bytes(d.topic.ring_bytes)} each"
                                  + "".join(f", {k}={v}" for k, v in sorted(d.topic.config.items()) if k != "ring.bytes"))
    return EXIT_OK


def _ring_use(p, ring_bytes: int) -> str:
    return f"{100 * getattr(p, 'ring_unflushed_bytes', 0) / ring_bytes:.0f}%" if ring_bytes else "-"


def group_lag(admin, group: str) -> tuple[object, list[dict]]:
    """The group and one row per partition of its topics: member, committed offset, high
    watermark, lag (None without a committed offset), as ``groups describe`` shows them."""
    info = admin.describe_group(group)
    committed = {(t, p): o for t, p, o in info.offsets}
    holder = {}
    for m in info.members:
        for t, p in m.assignment:
            holder.setdefault((t, p), m.member_id)
        for t, p in m.owned:
            holder[(t, p)] = m.member_id  # who holds it now wins over who will
    topics = sorted({t for t, _p in committed} | {t for m in info.members for t in m.topics})
    rows = []
    for t in topics:
        try:
            offsets = admin.list_offsets(t)
        except TailraceError:  # deleted since: its committed offsets stay until the group goes
            offsets = []
        for po in offsets:
            c = committed.get((t, po.partition))
            rows.append({"topic": t, "partition": po.partition, "member": holder.get((t, po.partition)),
                         "committed": c, "high_watermark": po.high_watermark,
                         "lag": None if c is None else max(0, po.high_watermark - c)})
    return info, rows


def cmd_groups(args) -> int:
    with open_admin(args) as admin:
        if args.groups_cmd == "list":
            groups = admin.list_groups()
            if args.json:
                print_json([{"group": g.group, "state": g.state, "epoch": g.epoch} for g in groups])
            else:
                print_table(["group", "state", "epoch"], [[g.group, g.state, g.epoch] for g in groups])
        elif args.groups_cmd == "describe":
            info, rows = group_lag(admin, args.group)
            if args.json:
                print_json({"group": info.group, "state": info.state, "epoch": info.epoch,
                            "members": [as_builtins(m) for m in info.members], "partitions": rows})
            else:
                print_table(["topic", "partition", "member", "committed", "high watermark", "lag"],
                            [[r["topic"], r["partition"], (r["member"] or "-")[:12], "-" if r["committed"] is None else r["committed"],
                              r["high_watermark"], "-" if r["lag"] is None else r["lag"]] for r in rows],
                            title=f"group {info.group}: {info.state}, {len(info.members)} members, epoch {info.epoch}")
        elif args.groups_cmd == "reset-offsets":
            offsets = admin.list_offsets(args.topic)
            to = args.to
            new = {(args.topic, po.partition): po.log_start_offset if to == "earliest" else po.high_watermark if to == "latest"
                   else int(to) for po in offsets}
            done = admin.reset_offsets(args.group, new)
            if args.json:
                print_json([{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(done.items())])
            else:
                print(f"group {args.group}: {args.topic} reset to {to} in {len(done)} partitions")
        else:  # delete
            admin.delete_group(args.group)
            if not args.json:
                print(f"deleted group {args.group}")
    return EXIT_OK
