"""CURVE for a launch across nodes (libsodium, as pyzmq ships it): every TCP socket of the launch
is encrypted, and a server socket admits only the launch's client key (a ZAP handler, pyzmq's
ThreadAuthenticator), so a peer without the key file cannot connect at all; inside the encryption
every message is still signed with the launch's secret (wire.py).

The keys are made per launch, with the signing secret, into one file (0600) that node 0 writes
and every other node reads: a file the user's launcher copies, or one in a shared folder.

    {"server_public": z85, "server_secret": z85, "client_public": z85, "client_secret": z85,
     "secret": hex}
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import zmq

FIELDS = ("server_public", "server_secret", "client_public", "client_secret", "secret")


class KeyFileError(ValueError):
    """The key file cannot be read or written: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class LaunchKeys:
    server_public: str
    server_secret: str
    client_public: str
    client_secret: str
    secret: str  # hex: the HMAC key every message is signed with

    @property
    def signing(self) -> bytes:
        return bytes.fromhex(self.secret)

    @classmethod
    def make(cls) -> "LaunchKeys":
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public.decode(), server_secret.decode(), client_public.decode(), client_secret.decode(),
                   secrets.token_hex(32))

    def write(self, path: Path) -> None:
        """Write the file, readable by its owner only; refuses a file that exists (a launch's keys
        are its own)."""
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyFileError(f"{path}: exists already (a launch makes its own keys: remove the old file)") from None
        except OSError as error:
            raise KeyFileError(f"{path}: cannot be written: {error.strerror}") from None
        with os.fdopen(descriptor, "w") as handle:
            json.dump(asdict(self), handle)

    @classmethod
    def read(cls, path: Path, wait_s: float = 0.0) -> "LaunchKeys":
        """The keys in `path`, waiting up to `wait_s` for it to appear (a shared folder)."""
        deadline = time.monotonic() + wait_s
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise KeyFileError(f"{path}: no such key file (node 0 writes it; copy it here or share the "
                               f"folder){f' within {wait_s:g} s' if wait_s else ''}") from None
        except OSError as error:
            raise KeyFileError(f"{path}: cannot be read: {error.strerror}") from None
        try:
            data = json.loads(text) if text.strip() else None  # node 0 may be writing it still
        except json.JSONDecodeError as error:
            raise KeyFileError(f"{path}: not a radiance key file ({error.msg})") from None
        if data is None and time.monotonic() < deadline:
            time.sleep(0.1)
            return cls.read(path, deadline - time.monotonic())
        if not isinstance(data, dict):
            raise KeyFileError(f"{path}: not a radiance key file")
        for field in FIELDS:
            value = data.get(field)
            length = 64 if field == "secret" else 40
            if not isinstance(value, str) or len(value) != length:
                raise KeyFileError(f"{path}: field '{field}' must be a {length}-character key")
        return cls(**{field: data[field] for field in FIELDS})


class Guard:
    """The ZAP handler of one zmq context: its CURVE server sockets admit the launch's client key
    and nothing else. One per process that binds; `close` before the context terminates."""

    def __init__(self, context: zmq.Context, keys: LaunchKeys):
        self.keys = keys
        self.refused = 0
        from zmq.auth.thread import ThreadAuthenticator  # here: it imports asyncio (0.15 s a process)

        self.authenticator = ThreadAuthenticator(context)
        self.authenticator.start()
        self.authenticator.configure_curve_callback("*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = key == self.keys.client_public.encode()
        self.refused += not allowed
        return allowed

    def close(self) -> None:
        self.authenticator.stop()


def serve(socket: zmq.Socket, keys: LaunchKeys) -> zmq.Socket:
    """Make `socket` a CURVE server with the launch's server key (its context needs a Guard)."""
    socket.curve_server = True
    socket.curve_secretkey = keys.server_secret.encode()
    socket.curve_publickey = keys.server_public.encode()
    return socket


def client(socket: zmq.Socket, keys: LaunchKeys) -> zmq.Socket:
    """Make `socket` a CURVE client of the launch's servers, with the launch's client key."""
    socket.curve_serverkey = keys.server_public.encode()
    socket.curve_publickey = keys.client_public.encode()
    socket.curve_secretkey = keys.client_secret.encode()
    return socket
