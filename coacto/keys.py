"""CurveZMQ key pairs for servers and devices (docs/SECURITY.md).

A key pair is two files in ZeroMQ's certificate format: ``NAME.key`` (the public key, safe to copy
anywhere) and ``NAME.key_secret`` (public and secret key, readable by its owner only). The server
holds its secret file and a folder of the public files of the devices it serves; a device holds
its own secret file and the server's public key. ``coacto keygen`` writes them.

Where a key is asked for, a path to either file or the 40-character Z85 text of the key itself is
accepted. Environment variables give the same to programs that do not pass them:

    COACTO_SECRET_KEY    the server's secret key file (coacto-server --secret-key)
    COACTO_ALLOWED_KEYS  the folder of allowed devices' public keys (coacto-server --allowed-keys)
    COACTO_SERVER_KEY    the server's public key, on a device (coacto-client --server-key)
    COACTO_CLIENT_KEY    the device's own secret key file (coacto-client --client-key)
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from .errors import CoactoError

ENV_SECRET_KEY = "COACTO_SECRET_KEY"
ENV_ALLOWED_KEYS = "COACTO_ALLOWED_KEYS"
ENV_SERVER_KEY = "COACTO_SERVER_KEY"
ENV_CLIENT_KEY = "COACTO_CLIENT_KEY"

#: A folder of allowed keys is read again at most this often (a device added while the server
#: runs is served without a restart; a removed one is refused from its next connection).
RELOAD_EVERY_S = 1.0
#: Allowed-key files larger than this are not ZeroMQ certificates: skipped unread.
MAX_KEY_FILE_BYTES = 64 * 1024

_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
HOW_TO_MAKE = ("make keys with `coacto keygen --out keys/ server` (and one `coacto keygen --out "
               "keys/ DEVICE` per device; copy DEVICE.key into the server's allowed-keys folder "
               "and server.key to the device)")


class KeyFileError(CoactoError):
    """A key file or key text that cannot be used."""


def is_z85_key(text) -> bool:
    return isinstance(text, str) and bool(_Z85_KEY.match(text))


def generate(directory: str | os.PathLike, name: str, force: bool = False) -> tuple[Path, Path]:
    """Writes NAME.key and NAME.key_secret (mode 0600) in ``directory`` (created if needed);
    returns both paths. Refuses to overwrite an existing pair unless ``force``."""
    import zmq.auth

    if not isinstance(name, str) or not _NAME.match(name):
        raise KeyFileError(f"key name {name!r}: use 1 to 64 letters, digits, '_', '-' or '.'")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    if not force and (public.exists() or secret.exists()):
        raise KeyFileError(f"{public} or {secret} already exists; choose another name or pass "
                           f"--force to replace the pair")
    # the secret file is created private before any key is written into it
    old = os.umask(0o077)
    try:
        pub, sec = zmq.auth.create_certificates(str(folder), name)
    finally:
        os.umask(old)
    os.chmod(sec, 0o600)
    os.chmod(pub, 0o644)
    return Path(pub), Path(sec)


def _read_certificate(path: Path) -> tuple[bytes, bytes | None]:
    import zmq.auth

    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"{path} is not a key file (over {MAX_KEY_FILE_BYTES} bytes)")
        public, secret = zmq.auth.load_certificate(str(path))
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise KeyFileError(f"{path} is not a key file written by `coacto keygen` ({e})") from None
    if public is None or not is_z85_key(public.decode("ascii", "replace")):
        raise KeyFileError(f"{path} holds no public key; {HOW_TO_MAKE}")
    if secret is not None and not is_z85_key(secret.decode("ascii", "replace")):
        raise KeyFileError(f"{path} holds a malformed secret key; {HOW_TO_MAKE}")
    return public, secret


def load_pair(source, what: str = "secret key") -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a NAME.key_secret file."""
    if not isinstance(source, (str, os.PathLike)):
        raise KeyFileError(f"the {what} must be the path of a .key_secret file, got "
                           f"{type(source).__name__}")
    public, secret = _read_certificate(Path(source))
    if secret is None:
        raise KeyFileError(f"{source} is a public key file; the {what} is the matching "
                           f".key_secret file")
    return public, secret


def load_public(source, what: str = "public key") -> bytes:
    """A Z85 public key from its 40-character text or from a .key / .key_secret file."""
    if isinstance(source, bytes):
        source = source.decode("ascii", "replace")
    if is_z85_key(source):
        return source.encode("ascii")
    if not isinstance(source, (str, os.PathLike)):
        raise KeyFileError(f"the {what} must be a key file's path or its 40-character Z85 text, "
                           f"got {type(source).__name__}")
    if not Path(source).exists():
        raise KeyFileError(f"the {what} {str(source)!r} is neither a file nor a 40-character Z85 "
                           f"key")
    return _read_certificate(Path(source))[0]


class AllowedKeys:
    """The public keys of the devices a server serves: every ``*.key`` file of a folder, read again
    when the folder changes (checked at most once per RELOAD_EVERY_S), or a fixed set of keys.
    ``in`` is what the server's authenticator asks for each new connection."""

    def __init__(self, source):
        self.folder: Path | None = None
        self._keys: frozenset[bytes] = frozenset()
        self._seen = None
        self._checked = 0.0
        self.skipped: list[str] = []
        if isinstance(source, (str, os.PathLike)) and not is_z85_key(str(source)):
            self.folder = Path(source)
            if not self.folder.is_dir():
                raise KeyFileError(f"allowed keys folder {str(self.folder)!r} does not exist or "
                                   f"is not a folder; {HOW_TO_MAKE}")
            self._reload(force=True)
        else:
            items = [source] if isinstance(source, (str, bytes)) else list(source)
            self._keys = frozenset(load_public(k, "allowed key") for k in items)

    def __len__(self) -> int:
        self._reload()
        return len(self._keys)

    def __contains__(self, key) -> bool:
        self._reload()
        if isinstance(key, str):
            key = key.encode("ascii", "replace")
        return key in self._keys

    def _reload(self, force: bool = False) -> None:
        if self.folder is None:
            return
        t = time.monotonic()
        if not force and t - self._checked < RELOAD_EVERY_S:
            return
        self._checked = t
        try:
            listing = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                             for p in self.folder.glob("*.key") if p.is_file())
        except OSError:
            return  # keep what was read last: a folder being edited must not lock everyone out
        if listing == self._seen:
            return
        keys, skipped = set(), []
        for name, _mtime, _size in listing:
            try:
                keys.add(_read_certificate(self.folder / name)[0])
            except KeyFileError as e:
                skipped.append(f"{name}: {e}")
        self._seen, self._keys, self.skipped = listing, frozenset(keys), skipped

    # pyzmq's authenticator asks a credentials provider through this
    def callback(self, domain: str, key: bytes) -> bool:
        return key in self


def from_env(name: str):
    value = os.environ.get(name)
    return value if value else None
