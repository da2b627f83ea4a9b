"""``tailrace keys``, ``tailrace acl`` and ``tailrace quota``: who may connect, what they may do, how fast.

keys writes CurveZMQ key pairs (broker/auth.py); acl and quota edit the rules and rates under
``<data-dir>/auth`` (broker/acl.py, broker/quota.py), which a running broker re-reads within a
second. None of them needs the broker to be running.
"""

from __future__ import annotations

import os
import sys

from tailrace.broker import acl as acl_mod
from tailrace.broker import auth as auth_mod
from tailrace.broker import quota as quota_mod
from tailrace.console import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from tailrace.ops import running
from tailrace.tables import as_builtins, print_json, print_table


def data_dir_of(args) -> str:
    """``--data-dir``, else ``$TAILRACE_DATA_DIR``, else ./data, as a real path."""
    return os.path.realpath(args.data_dir) if args.data_dir else os.path.realpath(os.environ.get("TAILRACE_DATA_DIR", "./data"))


def cmd_keys(args) -> int:
    try:
        public, secret = auth_mod.generate_keys(args.dir, args.name)
    except (FileExistsError, ValueError) as exc:
        print(f"tailrace keys: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_ERROR
    print(f"public key  {public}   (copy it into the broker's allow-list directory)")
    print(f"secret key  {secret}   (mode 0600: give it to the client as --key-file / key_file=)")
    return EXIT_OK


def cmd_acl(args) -> int:
    data_dir = data_dir_of(args)
    if args.acl_cmd == "list":
        rules = acl_mod.read_rules(data_dir)
        if args.json:
            print_json([as_builtins(r) for r in rules])
        else:
            print_table(["principal", "topics", "operations"],
                        [[r.principal, "all" if r.pattern == acl_mod.ALL_TOPICS else
                          (f"{r.pattern}*" if r.match == "prefix" else r.pattern), ",".join(r.ops)] for r in rules],
                        title=f"{len(rules)} rules" + ("" if rules else " (authorization off: every allowed key may do everything)"))
        return EXIT_OK
    if (args.topic is None) == (args.prefix is None):
        print("tailrace acl: give one of --topic NAME (or *) and --prefix PREFIX", file=sys.stderr)
        return EXIT_USAGE
    try:
        rule = acl_mod.check_rule(args.principal, args.topic if args.topic is not None else args.prefix,
                                  "exact" if args.topic is not None else "prefix", args.ops.split(","))
    except ValueError as exc:
        print(f"tailrace acl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    changed = (acl_mod.add_rule if args.acl_cmd == "add" else acl_mod.remove_rule)(data_dir, rule)
    what = {"add": ("added", "already there"), "remove": ("removed", "not there")}[args.acl_cmd][0 if changed else 1]
    print(f"{what}: {rule.principal} {','.join(rule.ops)} on {rule.pattern}{'*' if rule.match == 'prefix' and rule.pattern != '*' else ''}"
          f" ({acl_enforcement(data_dir)})", file=sys.stderr)
    return EXIT_OK


def acl_enforcement(data_dir: str) -> str:
    """Whether the rules just written are enforced: ACLs name the principals CurveZMQ
    authenticates, so a broker without ``--auth curve`` stores them and checks nothing."""
    live = running.live_settings(data_dir)
    if live is None:
        return f"stored; enforced only while a broker runs on {data_dir} with --auth curve (none runs there now)"
    if live.auth != "curve":
        return "stored; not enforced: the broker runs without --auth curve (ACLs need it)"
    return "the broker applies it within a second"


def cmd_quota(args) -> int:
    data_dir = data_dir_of(args)
    if args.quota_cmd == "list":
        quotas = quota_mod.read_quotas(data_dir)
        if args.json:
            print_json([as_builtins(q) for q in quotas])
        else:
            rate = lambda n: f"{n:,} B/s" if n else "unlimited"  # noqa: E731
            print_table(["principal", "producer_byte_rate", "consumer_byte_rate"],
                        [[q.principal + (" (default)" if q.principal == quota_mod.DEFAULT else ""),
                          rate(q.producer_byte_rate), rate(q.consumer_byte_rate)] for q in quotas],
                        title=f"{len(quotas)} quotas")
        return EXIT_OK
    if args.quota_cmd == "remove":
        gone = quota_mod.remove_quota(data_dir, args.principal)
        print(f"{'removed' if gone else 'no quota for'} {args.principal}", file=sys.stderr)
        return EXIT_OK
    if args.producer_byte_rate is None and args.consumer_byte_rate is None:
        print("tailrace quota set: give --producer-byte-rate and/or --consumer-byte-rate", file=sys.stderr)
        return EXIT_USAGE
    old = next((q for q in quota_mod.read_quotas(data_dir) if q.principal == args.principal), None)
    try:
        new = quota_mod.Quota(args.principal,
                              args.producer_byte_rate if args.producer_byte_rate is not None else (old.producer_byte_rate if old else 0),
                              args.consumer_byte_rate if args.consumer_byte_rate is not None else (old.consumer_byte_rate if old else 0))
        quota_mod.set_quota(data_dir, new)
    except ValueError as exc:
        print(f"tailrace quota: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{new.principal}: produce {new.producer_byte_rate or 'unlimited'} B/s, fetch {new.consumer_byte_rate or 'unlimited'} B/s"
          " (the broker applies it within a second)", file=sys.stderr)
    return EXIT_OK
