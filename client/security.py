"""CurveZMQ on the client side: the keys a client presents and the server key it expects.

A broker started with ``tailrace serve --auth curve`` accepts only clients whose public key is
in its allow-list, over CURVE (libzmq's elliptic-curve handshake and encryption). A client
gives its own key pair (``key_file``: the secret key file ``tailrace keys generate NAME``
wrote, ``NAME.key_secret``) and the broker's public key (``server_key``: the broker's
``<data-dir>/auth/server.key`` file, or its 40-character Z85 text). Every ZeroMQ socket of the
client (router and workers alike) carries them; the same-host Unix sockets are checked by the
peer's user id instead (actors/unix_server.py).

In another language these are three libzmq socket options on the DEALER before ``connect``:
``ZMQ_CURVE_SERVERKEY``, ``ZMQ_CURVE_PUBLICKEY``, ``ZMQ_CURVE_SECRETKEY`` (docs/PROTOCOL.md).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import zmq
import zmq.auth

from .errors import BootstrapError

Z85_KEY_CHARS = 40


class CurveKeys(NamedTuple):
    public: bytes  # the client's public key, Z85
    secret: bytes  # the client's secret key, Z85
    server: bytes  # the broker's public key, Z85

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the broker (before it connects)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server


def _server_key(value: str | bytes | os.PathLike) -> bytes:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    text = os.fspath(value)
    if len(text) == Z85_KEY_CHARS and not os.path.exists(text):
        key = text.encode()
    else:
        try:
            key, _secret = zmq.auth.load_certificate(text)
        except (OSError, ValueError) as exc:
            raise BootstrapError(f"server_key {text!r}: not a Z85 key and not a readable key file ({exc})") from None
    if key is None or len(key) != Z85_KEY_CHARS:
        raise BootstrapError(f"server_key {text!r}: no public key in it")
    return key


def curve_keys(key_file: str | os.PathLike | None, server_key: str | bytes | os.PathLike | None) -> CurveKeys | None:
    """The keys of a client's options, or None when it uses none (a broker without auth).
    Both or neither: one without the other is a ``BootstrapError`` (nothing is sent)."""
    if key_file is None and server_key is None:
        return None
    if key_file is None or server_key is None:
        raise BootstrapError("CURVE needs both key_file (the client's secret key file) and server_key (the broker's public key)")
    try:
        public, secret = zmq.auth.load_certificate(os.fspath(key_file))
    except (OSError, ValueError) as exc:
        raise BootstrapError(f"key_file {os.fspath(key_file)!r}: {exc}") from None
    if secret is None:
        raise BootstrapError(f"key_file {os.fspath(key_file)!r} holds no secret key: give the NAME.key_secret file")
    return CurveKeys(public, secret, _server_key(server_key))
