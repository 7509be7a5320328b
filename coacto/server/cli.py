"""The `coacto-server` command: serve offloaded inferences to any number of devices on one port.

Exit codes: 0 stopped by SIGINT/SIGTERM; 1 cannot start (bad bind address, models folder, ...);
2 bad usage."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from ..errors import CoactoError

log = logging.getLogger("coacto.server.cli")

EPILOG = """\
examples:
  coacto-server --bind tcp://*:5555 --threads 4 --models models/
        serve the .onnx / .ctg files of models/ (devices may upload others)
  coacto-server --bind tcp://127.0.0.1:0 --threads 2 -v
        a local test server on a free port (the port is logged)
  coacto-server --models models/ --max-model-mb 128 --heartbeat-timeout 5 --json-log
        smaller uploads only, forget silent devices after 5 s, JSON log lines

Devices connect with coacto-client --server tcp://HOST:5555 (protocol: docs/PROTOCOL.md).
The connection is neither encrypted nor authenticated yet: serve on a trusted network only.
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
    p.add_argument("--bind", default="tcp://*:5555", metavar="ENDPOINT",
                   help="ZeroMQ endpoint to listen on (default tcp://*:5555; port 0 picks one)")
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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.json_log, args.verbose)
    if args.threads is not None and not 1 <= args.threads <= 1024:
        log.error("--threads must be from 1 to 1024")
        return 2
    if args.max_model_mb <= 0 or args.heartbeat_timeout <= 0 or args.max_inferences < 1:
        log.error("--max-model-mb, --heartbeat-timeout and --max-inferences must be positive")
        return 2

    from .server import Server

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = Server(args.bind, threads=args.threads, models=args.models,
                        max_model_bytes=int(args.max_model_mb * (1 << 20)),
                        heartbeat_timeout=args.heartbeat_timeout,
                        max_inferences_per_device=args.max_inferences, cache_dir=args.cache_dir,
                        server_flops=args.server_flops)
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
    log.info("ready: %s, %d threads, %.3g GFLOP/s announced, heartbeat timeout %.1f s",
             server.address, server.threads, server.stats()["server_flops"] / 1e9,
             server.heartbeat_timeout)
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
