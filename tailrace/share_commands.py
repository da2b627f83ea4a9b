"""``tailrace consume --share-group``, ``tailrace share-groups`` and ``tailrace dlq replay``:
share groups (queue semantics, Kafka's KIP-932: client/share.py) from a shell.

consume --share-group G reads as a member of share group G (client/share.py ``ShareConsumer``)
and prints what it gets as ``consume`` does. A record is accepted once its line is written to
stdout; the acknowledgements go with the next fetch, or at exit. A write that fails (the reader
of a pipe left: EPIPE) releases the record it could not write, or rejects it with
``--reject-on-error`` (to the group's dead-letter topic, the error as its
``tailrace.dlq.error`` header); what was fetched after it goes back to the group as the member
leaves, and the command exits as ``consume`` does on a broken pipe (0, silently).

share-groups lists, describes and alters share groups (Kafka's kafka-share-groups and
kafka-configs for groups). dlq replay puts each record of a dead-letter topic back on the topic
and partition its ``tailrace.dlq.topic`` and ``tailrace.dlq.partition`` headers name (key, value
and its own headers kept, the ``tailrace.dlq.*`` ones dropped), and remembers how far it got as
the committed offsets of the consumer group ``<dlq topic>.replay``, committed only after the
records replayed are durable (acks=durable): a second run starts where the first stopped.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time

from tailrace import console
from tailrace.client import share_protocol as S
from tailrace.client.admin import Admin
from tailrace.client.consumer import EARLIEST, Consumer
from tailrace.client.errors import TailraceError
from tailrace.client.producer import Producer
from tailrace.client.share import ShareConsumer
from tailrace.console import EXIT_OK, EXIT_USAGE, interrupted_code, say
from tailrace.tables import print_json, print_table

SHARE_KEYS = ("share.record.lock.duration.ms", "share.delivery.count.limit", "share.retry.backoff.ms", "share.dlq.topic",
              "share.auto.offset.reset", "share.session.timeout.ms")  # router/share_state.py KEYS, for the help text
DLQ_PREFIX = "tailrace.dlq."
REPLAY_GROUP = "{}.replay"  # the consumer group whose committed offsets say how far a replay of {} got
POLL_MS = 500  # one fetch waits at most this long

_count = console.int_at_least(1)
_timeout_ms = console.int_at_least(1, maximum=(1 << 31) - 1)


def security(args) -> dict:
    """``--key-file`` and ``--server-key`` as client options (as admin_commands.py's: the command
    modules of one layer do not import each other)."""
    return {"key_file": args.key_file, "server_key": args.server_key}


def open_admin(args) -> Admin:
    return Admin(args.bootstrap, connect_timeout_ms=args.connect_timeout_ms, **security(args))


def _config(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VALUE (NAME= resets it), e.g. share.auto.offset.reset=earliest")
    return name.strip(), value.strip()


def add_parsers(sub, consume_parser, command, with_bootstrap) -> None:
    """``consume --share-group`` (on ``consume_parser``), ``share-groups`` and ``dlq``, on the
    parsers tailrace/cli.py builds (``command`` and ``with_bootstrap`` are its helpers)."""
    co = consume_parser
    co.add_argument("--share-group", default=None, metavar="G",
                    help="consume as a member of share group G (queue semantics): records are shared out one by one "
                         "among its members, each accepted once printed; where a new group starts is its "
                         "share.auto.offset.reset (`share-groups alter`), not --from")
    co.add_argument("--reject-on-error", action="store_true",
                    help="with --share-group: a record that cannot be written (a broken pipe) is rejected to the "
                         "group's dead-letter topic instead of released to be delivered again")

    sg = command(sub, "share-groups", "share groups (queues): list, describe, alter their settings (Kafka's "
                                      "kafka-share-groups)")
    ssub = sg.add_subparsers(dest="share_cmd", required=True, metavar="SUBCOMMAND")
    sl = command(ssub, "list", "every share group")
    sd = command(ssub, "describe", "members, and per partition: start, end, in flight, acquired, available, "
                                   "deliveries, dead-lettered; the dead-letter topic")
    sd.add_argument("group", help="share group name")
    sa = command(ssub, "alter", "set a share group's settings (made if it does not exist yet)")
    sa.add_argument("group", help="share group name")
    sa.add_argument("--config", type=_config, nargs="+", action="extend", required=True, metavar="NAME=VALUE",
                    help=f"settings, repeatable (NAME= resets one to the default): {', '.join(SHARE_KEYS)} "
                         "(share.dlq.topic=none archives dead records)")
    for p in (sl, sd, sa):
        with_bootstrap(p)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sg.set_defaults(func=cmd_share_groups)

    dq = command(sub, "dlq", "dead-letter topics of share groups")
    dsub = dq.add_subparsers(dest="dlq_cmd", required=True, metavar="SUBCOMMAND")
    rp = with_bootstrap(command(dsub, "replay", "put each record of a dead-letter topic back on the topic and partition "
                                                "it came from (its tailrace.dlq.* headers dropped); a second run goes on "
                                                "from where the last stopped"))
    rp.add_argument("name", metavar="DLQ_TOPIC", help="the dead-letter topic, e.g. G.dlq")
    rp.add_argument("--max-messages", type=_count, default=None, metavar="N", help="replay at most N records")
    rp.add_argument("--dry-run", action="store_true", help="print what would be replayed; produce and remember nothing")
    rp.add_argument("--timeout-ms", type=_timeout_ms, default=10_000, metavar="MS",
                    help="give up when the topic's records up to its end at the start have not come within MS ms")
    dq.set_defaults(func=cmd_dlq)


# --- consume --share-group -----------------------------------------------------------------------
def _write_all(fd: int, data: bytes) -> int:
    """Write ``data`` to ``fd``; returns the bytes written, or raises ``BrokenPipeError`` with
    ``.written`` set to how many got out before the pipe broke."""
    view, done = memoryview(data), 0
    while done < len(view):
        try:
            done += os.write(fd, view[done:])
        except InterruptedError:
            continue
        except BrokenPipeError as exc:
            exc.written = done
            raise
    return done


def _stdout_fd() -> int | None:
    try:
        sys.stdout.flush()
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def consume(args) -> int:
    """``tailrace consume NAME --share-group G``: kept options: --max, --timeout-ms, --print-*,
    --format, --json, --base64; --partition, --from, --from-time, --group and --isolation durable
    are usage errors (the group decides what each member gets)."""
    bad = [opt for opt, given in (("--partition", args.partition is not None), ("--from-time", args.from_time is not None),
                                  ("--from", args.from_ != EARLIEST or args.from_beginning),
                                  ("--group", args.group is not None), ("--isolation", args.isolation != "memory"))
           if given]
    if bad:
        say(f"with --share-group the group decides what each member reads: {', '.join(bad)} do not apply (a new group "
            "starts at its share.auto.offset.reset: tailrace share-groups alter G --config share.auto.offset.reset=earliest)")
        return EXIT_USAGE
    render = console.formatter(args)
    fd = _stdout_fd()
    out = sys.stdout.buffer
    seen = 0
    cons = ShareConsumer(args.bootstrap, group=args.share_group, topics=[args.name],
                         connect_timeout_ms=args.connect_timeout_ms, **security(args))
    cap = cons.max_records
    try:
        last_new = time.monotonic()
        while args.max is None or seen < args.max:
            if args.max is not None:
                cons.max_records = max(1, min(cap, args.max - seen))  # acquire no more than will be printed
            wait = POLL_MS if args.timeout_ms is None else max(
                1, min(POLL_MS, int(args.timeout_ms - (time.monotonic() - last_new) * 1000)))
            records = cons.poll(wait)
            if records:
                last_new = time.monotonic()
                if args.max is not None:
                    records = records[: args.max - seen]  # the rest go back as the member leaves
                seen += _print_and_accept(cons, records, render, fd, out, args.reject_on_error)
            elif args.timeout_ms is not None and (time.monotonic() - last_new) * 1000 >= args.timeout_ms:
                break
        cons.commit_sync()
    except KeyboardInterrupt as stop:  # close() below sends the acknowledgements and leaves
        say(f"interrupted: consumed {seen} messages")
        return interrupted_code(stop)
    finally:
        try:
            cons.close()
        finally:
            if cons.failed:
                first = cons.failed[0]
                say(f"tailrace: the group refused {len(cons.failed)} acknowledgements (first: {first.message or first.code}): "
                    "their records may be delivered again")
    return EXIT_OK


def _print_and_accept(cons: ShareConsumer, records: list, render, fd: int | None, out, reject: bool) -> int:
    """Write ``records`` one line each; accept each one written. A broken pipe: the record being
    written is rejected (``reject``) or released, the ones after it are left to go back as the
    member leaves, and ``BrokenPipeError`` goes on up (the command exits as ``consume`` does)."""
    lines = [render([r]) for r in records]
    try:
        if fd is not None:
            _write_all(fd, b"".join(lines))
        else:
            out.write(b"".join(lines))
            out.flush()
    except BrokenPipeError as exc:
        written = getattr(exc, "written", 0)
        n = 0
        while n < len(lines) and written >= len(lines[n]):
            written -= len(lines[n])
            n += 1
        if n:
            cons.acknowledge(records[:n])
        if n < len(records):
            why = f"tailrace consume: writing to stdout failed: {exc.strerror or errno.errorcode.get(exc.errno, exc)}"
            cons.acknowledge(records[n], "reject" if reject else "release", error=why,
                             delay_ms=None if reject else 0)
        raise
    cons.acknowledge(records)
    return len(records)


# --- share-groups ----------------------------------------------------------------------------------
def _row(struct) -> dict:
    return {f: getattr(struct, f) for f in struct.__struct_fields__}


def _histogram(h: list[int]) -> str:
    return " ".join(f"{i}:{n}" for i, n in enumerate(h) if n) or "-"


def cmd_share_groups(args) -> int:
    with open_admin(args) as admin:
        if args.share_cmd == "list":
            groups = admin.list_share_groups()
            if args.json:
                print_json(groups)
            else:
                print_table(["share group"], [[g] for g in groups])
            return EXIT_OK
        if args.share_cmd == "alter":
            info = admin.alter_share_group(args.group, dict(args.config))
        else:
            info = admin.describe_share_group(args.group)
        held = _dlq_records(admin, info.dlq_topic)
    if args.json:
        print_json({"group": info.group, "config": info.config, "dlq_topic": info.dlq_topic, "dlq_records": held,
                    "members": [_row(m) for m in info.members], "partitions": [_row(p) for p in info.partitions]})
        return EXIT_OK
    if args.share_cmd == "alter":
        print(f"share group {info.group} settings: " + ", ".join(f"{k}={v}" for k, v in sorted(info.config.items())))
        return EXIT_OK
    dead = sum(p.dead for p in info.partitions)
    dlq = f"dead letters to {info.dlq_topic} ({dead} so far)" if info.dlq_topic else f"dead records archived ({dead} so far)"
    if held is not None:
        dlq += f"; {info.dlq_topic} holds {held}"
    print_table(["topic", "partition", "start", "end", "in flight", "acquired", "available", "deliveries", "dead"],
                [[p.topic, p.partition, p.start, p.end, p.in_flight, p.acquired, p.available,
                  _histogram(p.delivery_histogram), p.dead] for p in info.partitions],
                title=f"share group {info.group}: {len(info.members)} members, {dlq}")
    if info.members:
        print_table(["member", "topics", "acquired", "idle ms"],
                    [[m.member_id[:12], ",".join(m.topics), m.acquired, m.idle_ms] for m in info.members])
    print("settings: " + ", ".join(f"{k}={v}" for k, v in sorted(info.config.items())))
    return EXIT_OK


def _dlq_records(admin: Admin, topic: str) -> int | None:
    """Records the dead-letter topic holds now (None: no such topic yet, or none configured)."""
    if not topic:
        return None
    try:
        return sum(p.high_watermark - p.log_start_offset for p in admin.list_offsets(topic))
    except TailraceError:
        return None


# --- dlq replay --------------------------------------------------------------------------------------
def _origin(headers) -> tuple[str | None, int | None, list]:
    """A dead record's topic and partition (its provenance headers), and its other headers."""
    topic = partition = None
    kept = []
    for k, v in headers:
        if k == S.DLQ_TOPIC and v is not None:
            topic = v.decode("utf-8", "replace")
        elif k == S.DLQ_PARTITION and v is not None and v.strip().isdigit():
            partition = int(v)
        elif not k.startswith(DLQ_PREFIX):
            kept.append((k, v))
    return topic, partition, kept


def cmd_dlq(args) -> int:
    return replay(args)  # the one subcommand so far


def replay(args) -> int:
    dlq, group = args.name, REPLAY_GROUP.format(args.name)
    with open_admin(args) as admin:
        ends = {po.partition: po for po in admin.list_offsets(dlq)}
        committed = admin.committed(group, [dlq])
        start = {p: max(po.log_start_offset, committed.get((dlq, p), 0)) for p, po in ends.items()}
        todo = {p: po.high_watermark for p, po in ends.items() if start[p] < po.high_watermark}
        if not todo:
            print(f"{dlq}: nothing to replay (group {group} is at the end)")
            return EXIT_OK
        cons = Consumer(args.bootstrap, connect_timeout_ms=args.connect_timeout_ms, **security(args))
        prod = None if args.dry_run else Producer(args.bootstrap, acks="durable", linger_ms=0,
                                                  connect_timeout_ms=args.connect_timeout_ms, **security(args))
        done = skipped = 0
        where: dict[str, int] = {}
        try:
            cons.assign(dlq, sorted(todo))
            for p in todo:
                cons.seek(dlq, p, start[p])
            last_new = time.monotonic()
            while todo and (args.max_messages is None or done + skipped < args.max_messages):
                records = [r for r in cons.poll(POLL_MS) if r.offset < todo.get(r.partition, -1)]
                if not records:
                    if (time.monotonic() - last_new) * 1000 >= args.timeout_ms:
                        raise TailraceError(f"{dlq}: no records within {args.timeout_ms} ms below its end at the start; "
                                            f"replayed {done}")
                    continue
                last_new = time.monotonic()
                if args.max_messages is not None:
                    records = records[: args.max_messages - done - skipped]
                upto: dict[tuple[str, int], int] = {}
                for r in records:
                    topic, partition, headers = _origin(r.headers)
                    upto[(dlq, r.partition)] = r.offset + 1
                    if topic is None or partition is None:
                        say(f"{dlq}/{r.partition}@{r.offset}: no {S.DLQ_TOPIC}/{S.DLQ_PARTITION} headers: skipped")
                        skipped += 1
                        continue
                    if args.dry_run:
                        print(f"would replay {dlq}/{r.partition}@{r.offset} -> {topic}/{partition} "
                              f"(key {'null' if r.key is None else repr(r.key.decode('utf-8', 'replace'))}, "
                              f"{len(r.value)} bytes, {len(headers)} headers)")
                    else:
                        prod.send(topic, r.value, r.key, headers=headers, partition=partition)
                    where[topic] = where.get(topic, 0) + 1
                    done += 1
                if prod is not None:
                    prod.flush()  # durable (or raises) before the offsets say they are done
                    admin.reset_offsets(group, upto)
                for (_t, p), o in upto.items():
                    if o >= todo.get(p, 0):
                        todo.pop(p, None)
        except KeyboardInterrupt as stop:
            say(f"interrupted: replayed {done} records (remembered up to the last durable batch)")
            return interrupted_code(stop)
        finally:
            cons.close()
            if prod is not None:
                prod.pool.close()  # no flush here: each batch was flushed before its offsets were committed
    verb = "would replay" if args.dry_run else "replayed"
    to = ", ".join(f"{n} to {t}" for t, n in sorted(where.items())) or "none"
    print(f"{dlq}: {verb} {done} records ({to})" + (f", skipped {skipped} without provenance headers" if skipped else ""))
    return EXIT_OK
