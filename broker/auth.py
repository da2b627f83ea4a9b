"""Authentication on the broker side: CurveZMQ keys, the allow-list, the ZAP handler.

``tailrace serve --auth curve`` makes the router's client endpoint and every worker's ZeroMQ
endpoint CURVE servers. Keys are Z85 files as ``zmq.auth`` writes them (``NAME.key`` public,
``NAME.key_secret`` secret, mode 0600):

- ``<data-dir>/auth/server.key_secret``: the broker's key pair, made on first start; clients
  are given ``<data-dir>/auth/server.key`` (``server_key=``).
- ``<data-dir>/auth/router.key_secret``: the router's own client key pair. Workers obey
  assignments, ADOPT and PING only in messages whose connection proved this key (ZeroMQ's
  ``User-Id`` of each message, not the identity string a peer declares): a process posing as
  the router gets ``NOT_AUTHORIZED`` and changes nothing. (ZAP cannot check this at the
  handshake: libzmq gives the handler the server's own identity, not the peer's.)
- the allow-list (``--allow-dir``, default ``<data-dir>/auth/clients``): one public key file per
  principal, ``NAME.key``, the principal being NAME (``tailrace keys generate NAME`` writes the
  pair). It is re-read when the directory changes: a new file allows new connections at once;
  a removed one refuses every later request of its connections with ``NOT_AUTHORIZED`` (the
  key of each message is looked up in the current list, ZeroMQ's ``User-Id`` metadata).

The ZAP handler is ``zmq.auth.Authenticator`` served from the process's own poll loop (no
thread): its ``handle_zap_message`` is a coroutine that awaits nothing with a plain callback, so
one ``send(None)`` runs it to the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import zmq
import zmq.auth
import zmq.utils.z85

from tailrace.client import protocol as P
from tailrace.client.security import CurveKeys

from . import datadir

AUTH_DIR = datadir.AUTH_DIR
SERVER_KEY = datadir.SERVER_KEY
ROUTER_KEY = datadir.ROUTER_KEY
ROUTER_PRINCIPAL = "router"
# in a cluster, broker N's router asking this one (its router key, from its registration): "broker/N"
BROKER_PREFIX = "broker/"
CLIENTS_DIR = datadir.CLIENTS_DIR
MODES = ("none", "curve")

log = logging.getLogger("tailrace.auth")


def auth_dir(data_dir: str) -> str:
    return os.path.join(data_dir, AUTH_DIR)


def default_allow_dir(data_dir: str) -> str:
    return os.path.join(auth_dir(data_dir), CLIENTS_DIR)


def cluster_allow_dir(data_dir: str) -> str:
    """Where a cluster broker mirrors the cluster's allow-list from etcd (cluster/access.py)."""
    return os.path.join(auth_dir(data_dir), datadir.CLUSTER_CLIENTS_DIR)


def allow_dir_of(s) -> str:
    """The allow-list directory the broker's processes read: ``--allow-dir``, else the cluster's
    mirror (with ``--cluster``), else ``<data-dir>/auth/clients``."""
    return s.allow_dir or (cluster_allow_dir(s.data_dir) if s.cluster else default_allow_dir(s.data_dir))


PUBLIC_KEY_TEXT = """#   ****  tailrace: {name}'s public key, written by {origin}  ****
metadata
curve
    public-key = "{key}"
"""


RESERVED_PRINCIPALS = (ROUTER_PRINCIPAL,)  # taken by the broker's own keys: no allow-listed client may be one


def check_principal_name(name: str) -> str:
    """``name`` if it may name an allowed client (a key file's name), else ValueError."""
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise ValueError(f"principal {name!r}: a key file's name (no '/', not starting with '.', no outer spaces)")
    if name in RESERVED_PRINCIPALS:
        raise ValueError(f"principal {name!r} is reserved for the broker's own keys")
    return name


def check_public_key(key: bytes | str) -> str:
    """A CURVE public key as its 40 Z85 characters, else ValueError."""
    try:
        text = key.decode("ascii") if isinstance(key, bytes) else key
        if len(text) != 40 or len(zmq.utils.z85.decode(text)) != 32:
            raise ValueError
    except (ValueError, KeyError, UnicodeDecodeError):  # z85.decode raises KeyError on a character outside Z85
        raise ValueError("not a CURVE public key (40 Z85 characters)") from None
    return text


def sync_allowed(directory: str, clients: dict[str, str]) -> bool:
    """Make ``directory`` hold exactly ``clients`` (principal -> Z85 public key) as ``NAME.key``
    files, the format ``zmq.auth`` reads; True if anything changed. Stale files go first (a
    revocation does not wait on a write that fails), then new ones are written atomically."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    changed = False
    wanted = {datadir.public_key_name(n) for n in clients}
    for entry in os.listdir(directory):
        if entry.endswith(datadir.PUBLIC_KEY_SUFFIX) and entry not in wanted:
            os.unlink(os.path.join(directory, entry))
            changed = True
    for name, key in clients.items():
        path = os.path.join(directory, datadir.public_key_name(name))
        body = PUBLIC_KEY_TEXT.format(name=name, key=key, origin="the broker from the cluster's allow-list in etcd "
                                      "(tailrace keys allow|revoke --cluster changes it)").encode()
        try:
            with open(path, "rb") as f:
                if f.read() == body:
                    continue
        except FileNotFoundError:
            pass
        datadir.write_atomic(path, body, mode=0o644)
        changed = True
    return changed


def generate_keys(directory: str, name: str) -> tuple[str, str]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (0600) into ``directory``; an existing pair is
    never overwritten (FileExistsError). Returns (public file, secret file)."""
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise ValueError(f"bad key name {name!r}: a file name, not a path, not starting with '.'")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    public, secret = os.path.join(directory, datadir.public_key_name(name)), os.path.join(directory, datadir.secret_key_name(name))
    for path in (public, secret):
        if os.path.exists(path):
            raise FileExistsError(f"{path} exists: a key is never overwritten (remove it first)")
    tmp = tempfile.mkdtemp(prefix=datadir.KEYS_TEMP_PREFIX, dir=directory)
    try:
        made_public, made_secret = zmq.auth.create_certificates(tmp, name)
        os.chmod(made_secret, 0o600)
        os.chmod(made_public, 0o644)
        os.link(made_secret, secret)  # the secret first: a public file never stands without its pair
        os.link(made_public, public)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return public, secret


def ensure_keys(directory: str, name: str) -> tuple[bytes, bytes]:
    """The key pair ``name`` in ``directory``, made the first time (processes starting together
    agree: the first link wins). Returns (public, secret), Z85."""
    secret_file = os.path.join(directory, datadir.secret_key_name(name))
    if not os.path.exists(secret_file):
        try:
            generate_keys(directory, name)
        except FileExistsError:
            pass  # another process of the broker made it meanwhile
    public, secret = zmq.auth.load_certificate(secret_file)
    return public, secret


def server_keys(data_dir: str) -> tuple[bytes, bytes]:
    return ensure_keys(auth_dir(data_dir), SERVER_KEY)


def router_client_keys(data_dir: str) -> CurveKeys:
    """The router's keys as a CURVE client of the workers."""
    public, secret = ensure_keys(auth_dir(data_dir), ROUTER_KEY)
    return CurveKeys(public, secret, server_keys(data_dir)[0])


def make_server(sock: zmq.Socket, data_dir: str) -> None:
    """Make ``sock`` a CURVE server with the broker's key (before it binds)."""
    public, secret = server_keys(data_dir)
    sock.curve_server = True
    sock.curve_secretkey = secret
    sock.curve_publickey = public


class AllowList:
    """Z85 public key -> principal, from a directory of ``NAME.key`` files, re-read when it changes
    (``refresh``, called at each handshake and every heartbeat). ``fixed`` keys (the router's)
    are always there."""

    def __init__(self, directory: str, fixed: dict[str, str] | None = None):
        self.directory = directory
        self.fixed = dict(fixed or {})
        self.keys: dict[str, str] = dict(self.fixed)
        self._seen = None
        self.refresh()

    def _signature(self):
        try:
            with os.scandir(self.directory) as it:
                return tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in it if e.name.endswith(datadir.PUBLIC_KEY_SUFFIX)))
        except FileNotFoundError:
            return ()

    def set_fixed(self, fixed: dict[str, str]) -> None:
        """Replace the keys not from the directory (a cluster's broker keys, as they come and go)."""
        if fixed != self.fixed:
            self.fixed, self._seen = dict(fixed), None
            self.refresh()

    def refresh(self) -> bool:
        """Re-read the directory if it changed; True if it did."""
        sig = self._signature()
        if sig == self._seen:
            return False
        keys = dict(self.fixed)
        for name, _m, _s in sig:
            path = os.path.join(self.directory, name)
            try:
                public, _secret = zmq.auth.load_certificate(path)
            except (OSError, ValueError) as exc:
                log.warning("allow-list: %s skipped (%s)", path, exc)
                continue
            principal = name[: -len(datadir.PUBLIC_KEY_SUFFIX)]
            if principal in RESERVED_PRINCIPALS:  # a client key named so would pass for the router at the workers
                log.warning("allow-list: %s skipped (%r is reserved for the broker's own keys)", path, principal)
                continue
            if public:
                keys[public.decode("ascii")] = principal
        if self._seen is not None:
            log.info("allow-list %s re-read: %d principals", self.directory, len(keys) - len(self.fixed))
        self.keys, self._seen = keys, sig
        return True

    def principal(self, user_id: str | None) -> str | None:
        return self.keys.get(user_id) if user_id else None


class ZapHandler(zmq.auth.Authenticator):
    """``zmq.auth``'s ZAP handler for CURVE against an ``AllowList``, served by ``service`` from
    the process's poll loop. The User-Id it gives a connection is the client's Z85 key (mapped
    to a principal per message, so a key removed from the list stops working at once)."""

    def __init__(self, ctx: zmq.Context, allow: AllowList):
        super().__init__(ctx, log=logging.getLogger("tailrace.auth.zap"))
        self.allow = allow
        self.refused = 0
        self._replied = False
        self.configure_curve_callback("*", self)

    # the credentials provider zmq.auth calls
    def callback(self, domain: str, key: bytes) -> bool:
        self.allow.refresh()
        return key.decode("ascii", "replace") in self.allow.keys

    def curve_user_id(self, client_public_key: bytes) -> str:
        return zmq.utils.z85.encode(client_public_key).decode("ascii")

    def service(self, limit: int = 64) -> int:
        n = 0
        while n < limit:
            try:
                msg = self.zap_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            self._replied = False
            try:
                self.handle(msg)
            except Exception:  # a hostile or broken request must not take the process down
                log.exception("ZAP request not understood")
            if not self._replied:  # the REP socket takes no next request before this one is answered
                self._send_zap_reply(msg[1] if len(msg) >= 2 else b"", b"400", b"bad ZAP request")
        return n

    def handle(self, msg: list[bytes]) -> None:
        coro = self.handle_zap_message(msg)
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()  # it awaited something: a credentials callback never does
        raise RuntimeError("ZAP handler awaited")

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous") -> None:
        if status_code != b"200":
            self.refused += 1
        self._replied = True
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


class Guard:
    """A process's side of CURVE: the ZAP handler, the allow-list, and the per-message check of
    the principal (``drain``). ``None`` in place of a Guard means auth is off."""

    def __init__(self, ctx: zmq.Context, data_dir: str, allow_dir: str, with_router: bool):
        fixed = {}
        if with_router:  # a worker: the router is a principal of its own
            fixed[router_client_keys(data_dir).public.decode("ascii")] = ROUTER_PRINCIPAL
        self.allow = AllowList(allow_dir or default_allow_dir(data_dir), fixed)
        self.zap = ZapHandler(ctx, self.allow)
        self.zap.start()  # bound before any CURVE socket binds: without a handler CURVE lets any key in

    def drain(self, sock, handle, refuse, limit: int = 512) -> int:
        """``P.drain`` with each message's principal: ``handle(frames, principal)``; a message
        whose key is no longer allowed goes to ``refuse(frames)`` instead."""
        for n in range(limit):
            try:
                first = P._recv(sock, P.NOBLOCK, False)
            except zmq.Again:
                return n
            frames = [first.bytes]
            while P._get(sock, P.RCVMORE):
                frames.append(P._recv(sock, 0))
            principal = self.allow.principal(first.get("User-Id"))
            if principal is None:
                refuse(frames)
            else:
                handle(frames, principal)
        return limit

    def close(self) -> None:
        self.zap.stop()


def refusal(ident: list[bytes], routing: bytes, why: str) -> list[bytes]:
    """The NOT_AUTHORIZED reply to a request (frames after ``ident`` start with its routing)."""
    try:
        _v, op, _c, partition, request_id, topic = P.unpack_routing(routing)
    except Exception:  # noqa: BLE001 - a short header: answered without its fields
        op, partition, request_id, topic = 0, -1, 0, b""
    return [*ident, P.pack_routing(op, partition, request_id, P.echo_topic(topic), P.ErrorCode.NOT_AUTHORIZED),
            P.encode(P.ErrorReply(why))]


def exposure_error(bind: str, auth: str, insecure: bool) -> str | None:
    """Why binding ``bind`` is refused (a non-loopback address without auth), or None."""
    if auth != "none" or insecure or not bind.startswith("tcp://"):
        return None
    host = bind[len("tcp://"):].rpartition(":")[0].strip("[]")
    if host == "localhost" or host == "::1" or host.startswith("127."):
        return None
    return (f"bind={bind} listens beyond this host with no authentication: anyone who reaches it could read, "
            "write and administer everything. Use --auth curve, or --insecure to accept that")


def is_loopback(bind: str) -> bool:
    return exposure_error(bind, "none", False) is None
