"""Who a server serves (docs/SECURITY.md): CurveZMQ keys and their authenticator, the rule that a
server without keys binds only local endpoints, and each connection's owner."""
from __future__ import annotations

import logging

import zmq

from .. import keys as K
from ..errors import CoactoError

log = logging.getLogger(__name__)

#: The ZAP domain of the server's socket (the authenticator answers for it only).
ZAP_DOMAIN = "coacto"


class ServerError(CoactoError):
    """The server cannot start (bad bind address, models folder, keys) or was used wrongly."""


def is_local_endpoint(endpoint: str) -> bool:
    """True for endpoints only this machine can reach: loopback TCP, ipc://, inproc://."""
    if not isinstance(endpoint, str):
        return False
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if ";" in host:  # tcp://SOURCE;HOST:PORT binds HOST
        host = host.split(";", 1)[1]
    return host == "localhost" or host == "::1" or host.startswith("127.")


class Security:
    """The server's keys (``secret_key``: its .key_secret file; ``allowed_keys``: a folder of
    devices' .key files or a list of keys; each from the environment when None), checked at
    construction: both or neither; without them only a local ``bind``, unless ``insecure``."""

    def __init__(self, bind: str, secret_key=None, allowed_keys=None, insecure: bool = False):
        secret_key = secret_key if secret_key is not None else K.from_env(K.ENV_SECRET_KEY)
        allowed_keys = allowed_keys if allowed_keys is not None else \
            K.from_env(K.ENV_ALLOWED_KEYS)
        if (secret_key is None) != (allowed_keys is None):
            raise ServerError("give both the server's secret key and the allowed devices' keys "
                              "(--secret-key and --allowed-keys), or neither; " + K.HOW_TO_MAKE)
        self.bind = bind
        self.secure = secret_key is not None
        self.insecure = bool(insecure) and not self.secure
        self._auth = None
        if self.secure:
            self._public, self._secret = K.load_pair(secret_key, "server's secret key")
            self.allowed = K.AllowedKeys(allowed_keys)
            for line in self.allowed.skipped:
                log.warning("allowed keys: skipping %s", line)
            if not len(self.allowed):
                log.warning("no device keys in the allowed keys folder yet: every device is "
                            "refused until one is added")
        elif not is_local_endpoint(bind) and not self.insecure:
            raise ServerError(
                f"refusing to serve {bind!r} without authentication: anyone who reaches it could "
                f"use this machine. {K.HOW_TO_MAKE[0].upper()}{K.HOW_TO_MAKE[1:]}, then pass "
                f"--secret-key keys/server.key_secret --allowed-keys DIR; or bind "
                f"tcp://127.0.0.1:PORT; or pass --insecure on a network you trust")

    @property
    def public_key(self) -> str | None:
        """The server's CurveZMQ public key (Z85), what devices pass as their server key."""
        return self._public.decode("ascii") if self.secure else None

    @property
    def label(self) -> str:
        """How devices are authenticated: "curve", "none (local endpoint)" or "none
        (insecure)"."""
        if self.secure:
            return "curve"
        return "none (insecure)" if self.insecure else "none (local endpoint)"

    @property
    def warning(self) -> str | None:
        """What a server started --insecure says at start and in every HELLO_OK."""
        if not self.insecure:
            return None
        return (f"this server serves {self.bind} WITHOUT authentication or encryption "
                f"(--insecure): anyone who reaches it can use it and read the tiles; "
                f"{K.HOW_TO_MAKE}")

    def configure(self, ctx: zmq.Context, sock: zmq.Socket) -> None:
        """Before bind: the authenticator on ``ctx`` and CURVE on ``sock`` (nothing without
        keys). Raises zmq.ZMQError, e.g. when the context already has an authenticator."""
        if not self.secure:
            return
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("coacto.server.auth"))
        self._auth.start()  # binds the context's ZAP endpoint: one per context
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self.allowed)
        sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.curve_secretkey = self._secret
        sock.curve_publickey = self._public
        sock.curve_server = True

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def owner(self, frame) -> tuple[str, str]:
        """(owner, peer address) of a message's connection: its CURVE public key when the
        server has keys (ZeroMQ passes the key the authenticator accepted as User-Id), else its
        address."""
        try:
            peer = frame.get("Peer-Address")
        except (zmq.ZMQError, AttributeError):
            peer = ""
        if self.secure:
            try:
                return frame.get("User-Id"), peer
            except (zmq.ZMQError, AttributeError):  # cannot happen behind CURVE + ZAP
                return "unauthenticated", peer
        return ("addr:" + peer) if peer else "", peer
