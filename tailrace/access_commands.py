"""``tailrace keys``, ``tailrace acl`` and ``tailrace quota``: who may connect, what they may do, how fast.

keys writes CurveZMQ key pairs (broker/auth.py) and allows or revokes public keys; acl and quota
edit the rules and rates. On a single host they live under ``<data-dir>/auth`` (broker/acl.py,
broker/quota.py), which a running broker re-reads within a second, and none of the commands
needs the broker to be running. With ``--cluster etcd://...`` they are the cluster's, in etcd
(cluster/access.py), and every broker mirrors them into its data directory as it sees them;
the data directory of a cluster broker is then refused (its files are the mirror).
"""

from __future__ import annotations

import os
import sys

import zmq.auth

from tailrace.broker import acl as acl_mod
from tailrace.broker import auth as auth_mod
from tailrace.broker import datadir
from tailrace.broker import quota as quota_mod
from tailrace.console import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from tailrace.ops import running
from tailrace.tables import as_builtins, print_json, print_table

EXTRA = "pip install 'tailrace[cluster]'"


def data_dir_of(args) -> str:
    """``--data-dir``, else ``$TAILRACE_DATA_DIR``, else ./data, as a real path."""
    return os.path.realpath(args.data_dir) if args.data_dir else os.path.realpath(os.environ.get("TAILRACE_DATA_DIR", "./data"))


class FileStore:
    """A single host's rules: the files under ``<data-dir>/auth``."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir

    def rules(self):
        return acl_mod.read_rules(self.data_dir)

    def add_rule(self, rule) -> bool:
        return acl_mod.add_rule(self.data_dir, rule)

    def remove_rule(self, rule) -> bool:
        return acl_mod.remove_rule(self.data_dir, rule)

    def quotas(self):
        return quota_mod.read_quotas(self.data_dir)

    def set_quota(self, quota) -> None:
        quota_mod.set_quota(self.data_dir, quota)

    def remove_quota(self, principal: str) -> bool:
        return quota_mod.remove_quota(self.data_dir, principal)

    def clients(self) -> dict[str, str]:
        allow = auth_mod.AllowList(auth_mod.default_allow_dir(self.data_dir))
        return {name: key for key, name in allow.keys.items()}

    def allow(self, name: str, public: bytes) -> bool:
        """Write ``NAME.key`` into the allow-list directory (only that file)."""
        key = auth_mod.check_public_key(public)
        held = self.clients().get(auth_mod.check_principal_name(name))
        if held == key:
            return False
        if held is not None:
            raise ValueError(f"principal {name!r} is allowed with another key already: revoke it first")
        directory = auth_mod.default_allow_dir(self.data_dir)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        datadir.write_atomic(os.path.join(directory, datadir.public_key_name(name)),
                             auth_mod.PUBLIC_KEY_TEXT.format(name=name, key=key, origin="tailrace keys allow").encode(),
                             mode=0o644)
        return True

    def revoke(self, name: str) -> bool:
        path = os.path.join(auth_mod.default_allow_dir(self.data_dir), datadir.public_key_name(auth_mod.check_principal_name(name)))
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def applied(self) -> str:
        return acl_enforcement(self.data_dir)


class ClusterStore:
    """A cluster's rules, in etcd (cluster/access.py)."""

    def __init__(self, url: str, name: str):
        from tailrace.cluster.access import ClusterAccess  # only with --cluster: a single host never imports etcd
        from tailrace.cluster.etcd import Etcd
        self.name = name
        self.access = ClusterAccess(Etcd(url, timeout_s=5.0), name)
        for verb in ("rules", "add_rule", "remove_rule", "quotas", "set_quota", "remove_quota", "clients", "allow", "revoke"):
            setattr(self, verb, getattr(self.access, verb))

    def applied(self) -> str:
        return f"every broker of cluster {self.name!r} mirrors it from etcd and applies it within a second"


def run_on_store(where: str, args, action) -> int:
    """``action(store)`` on the store ``args`` name (``--cluster``: etcd; else the data dir),
    its failures said in one line."""
    try:
        if getattr(args, "cluster", None):
            try:
                store = ClusterStore(args.cluster, args.cluster_name)
            except ImportError as exc:
                print(f"{where}: --cluster needs the cluster extra ({EXTRA}): {exc}", file=sys.stderr)
                return EXIT_ERROR
        else:
            data_dir = data_dir_of(args)
            live = running.live_settings(data_dir)
            if live is not None and live.cluster:
                print(f"{where}: the broker on {data_dir} is broker {live.broker_id} of cluster {live.cluster_name!r}: "
                      f"its rules are the cluster's (give --cluster {live.cluster} --cluster-name {live.cluster_name})",
                      file=sys.stderr)
                return EXIT_USAGE
            store = FileStore(data_dir)
        return action(store)
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - etcd unreachable or refusing (cluster/errors.py): one line
        if type(exc).__module__.startswith("tailrace.cluster"):
            print(f"{where}: etcd at {args.cluster}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                  file=sys.stderr)
            return EXIT_ERROR
        raise


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
    if args.acl_cmd == "list":
        return run_on_store("tailrace acl", args, lambda store: _list_rules(store.rules(), args.json))
    if (args.topic is None) == (args.prefix is None):
        print("tailrace acl: give one of --topic NAME (or *) and --prefix PREFIX", file=sys.stderr)
        return EXIT_USAGE
    try:
        rule = acl_mod.check_rule(args.principal, args.topic if args.topic is not None else args.prefix,
                                  "exact" if args.topic is not None else "prefix", args.ops.split(","))
    except ValueError as exc:
        print(f"tailrace acl: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def edit(store) -> int:
        changed = (store.add_rule if args.acl_cmd == "add" else store.remove_rule)(rule)
        what = {"add": ("added", "already there"), "remove": ("removed", "not there")}[args.acl_cmd][0 if changed else 1]
        print(f"{what}: {rule.principal} {','.join(rule.ops)} on {rule.pattern}"
              f"{'*' if rule.match == 'prefix' and rule.pattern != '*' else ''} ({store.applied()})", file=sys.stderr)
        return EXIT_OK
    return run_on_store("tailrace acl", args, edit)


def _list_rules(rules, as_json: bool) -> int:
    if as_json:
        print_json([as_builtins(r) for r in rules])
    else:
        print_table(["principal", "topics", "operations"],
                    [[r.principal, "all" if r.pattern == acl_mod.ALL_TOPICS else
                      (f"{r.pattern}*" if r.match == "prefix" else r.pattern), ",".join(r.ops)] for r in rules],
                    title=f"{len(rules)} rules" + ("" if rules else " (authorization off: every allowed key may do everything)"))
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
    if args.quota_cmd == "list":
        return run_on_store("tailrace quota", args, lambda store: _list_quotas(store.quotas(), args.json))
    if args.quota_cmd == "remove":
        def remove(store) -> int:
            gone = store.remove_quota(args.principal)
            print(f"{'removed' if gone else 'no quota for'} {args.principal}", file=sys.stderr)
            return EXIT_OK
        return run_on_store("tailrace quota", args, remove)
    if args.producer_byte_rate is None and args.consumer_byte_rate is None:
        print("tailrace quota set: give --producer-byte-rate and/or --consumer-byte-rate", file=sys.stderr)
        return EXIT_USAGE

    def set_(store) -> int:
        old = next((q for q in store.quotas() if q.principal == args.principal), None)
        new = quota_mod.Quota(args.principal,
                              args.producer_byte_rate if args.producer_byte_rate is not None else (old.producer_byte_rate if old else 0),
                              args.consumer_byte_rate if args.consumer_byte_rate is not None else (old.consumer_byte_rate if old else 0))
        store.set_quota(new)
        print(f"{new.principal}: produce {new.producer_byte_rate or 'unlimited'} B/s, fetch {new.consumer_byte_rate or 'unlimited'} B/s"
              f" ({store.applied()})", file=sys.stderr)
        return EXIT_OK
    return run_on_store("tailrace quota", args, set_)


def _list_quotas(quotas, as_json: bool) -> int:
    if as_json:
        print_json([as_builtins(q) for q in quotas])
    else:
        rate = lambda n: f"{n:,} B/s" if n else "unlimited"  # noqa: E731
        print_table(["principal", "producer_byte_rate", "consumer_byte_rate"],
                    [[q.principal + (" (default)" if q.principal == quota_mod.DEFAULT else ""),
                      rate(q.producer_byte_rate), rate(q.consumer_byte_rate)] for q in quotas],
                    title=f"{len(quotas)} quotas")
    return EXIT_OK


def cmd_keys_allowed(args) -> int:
    """``tailrace keys allow|revoke|list``: the allow-list of the data dir, or the cluster's."""
    where = f"tailrace keys {args.keys_cmd}"
    if args.keys_cmd == "list":
        def show(store) -> int:
            clients = store.clients()
            if args.json:
                print_json(dict(sorted(clients.items())))
            else:
                print_table(["principal", "public key"], sorted(clients.items()), title=f"{len(clients)} allowed keys")
            return EXIT_OK
        return run_on_store(where, args, show)
    if args.keys_cmd == "revoke":
        def revoke(store) -> int:
            gone = store.revoke(args.name)
            print(f"{'revoked' if gone else 'not allowed'}: {args.name}" + (f" ({store.applied()})" if gone else ""),
                  file=sys.stderr)
            return EXIT_OK
        return run_on_store(where, args, revoke)
    try:
        public = public_key_of(args.key)
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def allow(store) -> int:
        added = store.allow(args.name, public)
        print(f"{'allowed' if added else 'already allowed'}: {args.name} ({store.applied()})", file=sys.stderr)
        return EXIT_OK
    return run_on_store(where, args, allow)


def public_key_of(text: str) -> bytes:
    """A public key from a key file (NAME.key or NAME.key_secret) or its 40-character Z85 text."""
    if len(text) == 40 and not os.path.exists(text):
        return text.encode("ascii")
    try:
        public, _secret = zmq.auth.load_certificate(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{text!r}: not a Z85 key and not a readable key file ({exc})") from None
    if not public:
        raise ValueError(f"{text!r}: no public key in it")
    return public
