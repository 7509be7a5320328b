"""The `coacto-server` command: serve offloaded inferences to any number of devices on one port.

Exit codes (coacto.cli_common): 0 stopped by SIGINT/SIGTERM; 1 cannot start (the bind fails, a
models folder or key cannot be read, ...); 2 bad usage (a flag's value, a port out of range)."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from ..cli_common import UsageError, add_version, positive, usage_error, warn
from ..errors import CoactoError
from .server import DEFAULT_BIND

log = logging.getLogger("coacto.server.cli")

EPILOG = """\
examples:
  coacto keygen --out keys/ server && coacto keygen --out keys/ phone1
  mkdir allowed && cp keys/phone1.key allowed/
  coacto-server --bind tcp://*:5555 --secret-key keys/server.key_secret --allowed-keys allowed/ \\
                --threads 4 --models models/
        serve the .onnx / .ctg files of models/ to the devices whose public keys are in
        allowed/ (encrypted and authenticated with CurveZMQ; a .key file added there while
        the server runs is served, one removed is refused from its next connection); the
        device runs
        coacto-client --server tcp://HOST:5555 --server-key keys/server.key \\
                      --client-key keys/phone1.key_secret ...
  coacto-server --bind tcp://127.0.0.1:0 --threads 2 -v
        a local test server on a free port (the port is logged); loopback needs no keys
  coacto-server --models models/ --max-model-mb 128 --memory-limit 4096 --json-log
        smaller uploads only, tenants hold at most 4 GiB, JSON log lines
  coacto-server --bind tcp://192.168.1.10:5555 --insecure
        no keys on a network you trust: anyone who reaches the port is served, in clear text

Without --secret-key / --allowed-keys (or COACTO_SECRET_KEY / COACTO_ALLOWED_KEYS) the server
binds loopback only, unless --insecure. Limits and the threat model: docs/SECURITY.md.
Devices connect with coacto-client --server tcp://HOST:5555 (protocol: docs/PROTOCOL.md).

exit codes: 0 stopped by SIGINT or SIGTERM, 1 cannot start (the bind fails, a models folder or a
key cannot be read; message in the log), 2 bad usage (a flag's value, a --bind port outside
0..65535).
"""


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coacto-server", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve collaborative inference to edge devices: one ZeroMQ port, many devices, "
                    "many models, one shared tile runtime.")
    add_version(p, "coacto-server", protocol=True)
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="ENDPOINT",
                   help=f"ZeroMQ endpoint to listen on (default {DEFAULT_BIND}; port 0 picks "
                        f"one; another interface needs keys or --insecure)")
    p.add_argument("--secret-key", metavar="FILE",
                   help="the server's .key_secret file from `coacto keygen` (turns on CurveZMQ; "
                        "default $COACTO_SECRET_KEY)")
    p.add_argument("--allowed-keys", metavar="DIR",
                   help="folder of the .key files of the devices to serve, read again when it "
                        "changes (default $COACTO_ALLOWED_KEYS)")
    p.add_argument("--insecure", action="store_true",
                   help="serve a non-loopback endpoint without keys (anyone who reaches it is "
                        "served, in clear text)")
    p.add_argument("--memory-limit", type=float, default=None, metavar="MB",
                   help="memory the devices' inferences, queued results and models may hold in "
                        "all (default: half the RAM); one inference may take a quarter of it")
    p.add_argument("--threads", type=int, default=None,
                   help="computing threads shared by all devices (default: all CPUs)")
    p.add_argument("--models", metavar="DIR",
                   help="folder of .onnx and .ctg files to serve (devices may also upload)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="keep uploaded models here across restarts (default: memory only)")
    p.add_argument("--max-model-mb", type=float, default=512.0, metavar="MB",
                   help="largest model a device may upload (default 512)")
    p.add_argument("--max-inferences", type=int, default=8, metavar="N",
                   help="inferences in flight per device (default 8)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0, metavar="S",
                   help="seconds of silence after which a device's state is freed (default 10)")
    p.add_argument("--server-flops", type=float, default=None, metavar="FLOPS",
                   help="announce this FLOP rate instead of calibrating at start")
    p.add_argument("--stats-every", type=float, default=0.0, metavar="S",
                   help="log the server's counters every S seconds (default: only at exit)")
    p.add_argument("--json-log", action="store_true", help="log JSON lines (for log collectors)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging (every rejection)")
    return p


def _setup_logging(json_log: bool, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_log else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def _raise_fd_limit() -> None:
    """Every device connection is a socket: the usual soft limit of 1,024 descriptors would let a
    thousand idle connections lock every other device out (accept fails), long before the
    session limits apply. The hard limit is the operator's; the soft one is raised to it."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError) as e:  # not POSIX, or not allowed: keep it
        log.debug("keeping the file descriptor limit: %s", e)


def check_bind(bind: str) -> None:
    """A tcp port above 65535 is a usage error: libzmq would bind port 99999 as 34463 without a
    word. Other endpoints the bind itself judges (it says why it cannot bind, exit 1)."""
    if bind.startswith("tcp://"):
        port = bind.rpartition(":")[2]
        if port.isdigit() and int(port) > 65535:
            raise UsageError(f"--bind {bind!r}: port {port} is not from 0 to 65535 (0 picks a "
                             "free one)")


def check_usage(args) -> None:
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise UsageError("--threads must be from 1 to 1024")
    positive(args.max_inferences, "--max-inferences")
    for flag, value in (("--max-model-mb", args.max_model_mb),
                        ("--heartbeat-timeout", args.heartbeat_timeout),
                        ("--memory-limit", args.memory_limit),
                        ("--server-flops", args.server_flops)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be positive, got {value:g}")
    if not args.stats_every >= 0:
        raise UsageError("--stats-every must be 0 (only at exit) or a positive number of seconds")
    check_bind(args.bind)
    if args.insecure and args.secret_key is not None:
        warn("coacto-server", "--insecure is ignored with --secret-key: connections are "
                              "encrypted and authenticated")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.json_log, args.verbose)
    try:
        check_usage(args)
    except UsageError as e:
        return usage_error("coacto-server", e)

    from .server import Server

    _raise_fd_limit()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = Server(args.bind, threads=args.threads, models=args.models,
                        max_model_bytes=int(args.max_model_mb * (1 << 20)),
                        heartbeat_timeout=args.heartbeat_timeout,
                        max_inferences_per_device=args.max_inferences, cache_dir=args.cache_dir,
                        server_flops=args.server_flops, secret_key=args.secret_key,
                        allowed_keys=args.allowed_keys, insecure=args.insecure,
                        memory_limit=None if args.memory_limit is None
                        else int(args.memory_limit * (1 << 20)))
        server.start()
    except CoactoError as e:
        log.error("cannot start: %s", e)
        return 1
    except OSError as e:  # e.g. an unwritable cache folder
        log.error("cannot start: %s", e)
        return 1
    for m in server.loaded_models:
        if m["kind"] == "onnx":
            log.info("model %s: onnx, model_hash %s, %.1f MB", m["file"], m["model_hash"],
                     m["bytes"] / 1e6)
        else:
            log.info("model %s: tile graph %s (model_hash %s, %d tiles, params %s)", m["file"],
                     m["graph_id"], m["model_hash"], m["tiles"], m["params"])
    if server.secure:
        log.info("server public key (devices pass it as --server-key): %s", server.public_key)
    log.info("ready: %s, %d threads, %.3g GFLOP/s announced, heartbeat timeout %.1f s, %s",
             server.address, server.threads, server.stats()["server_flops"] / 1e9,
             server.heartbeat_timeout, server.security)
    next_stats = time.monotonic() + args.stats_every if args.stats_every > 0 else None
    try:
        while not stop.wait(0.2):
            if next_stats is not None and time.monotonic() >= next_stats:
                log.info("stats %s", json.dumps(server.stats()))
                next_stats += args.stats_every
    finally:
        log.info("shutting down; stats %s", json.dumps(server.stats()))
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
