"""The `coacto-client` command: run inferences of a model on this device with a coacto server.

Exit codes (coacto.cli_common): 0 success; 1 an error (a file, the model, the server); 2 bad usage
(a flag's value or combination)."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from ..cli_common import (RATE_HELP, exit_codes_help, UsageError, add_version, positive,
                          rate_schedule, usage_error, warn, warn_ignored)
from ..errors import CoactoError, InputError
from ..partition import OFFLOAD_MIN_COLUMN_BLOCKS
from .policies import POLICIES

log = logging.getLogger("coacto.mobile.cli")

EPILOG = """\
examples:
  coacto-client --server tcp://gpu-box:5555 --model resnet50.onnx --input data=img.npy
  coacto-client --server tcp://127.0.0.1:5555 --model model.onnx --input inputs.npz \\
                --policy split --bandwidth 20mbit --repeat 10 --json
  coacto-client --model model.onnx --input x=x.npy --policy local --output out.npz
  coacto-client --server tcp://gpu-box:5555 --server-key server.key \\
                --client-key keys/phone1.key_secret --model resnet50.onnx --random
                (a server with keys: coacto keygen makes them, docs/SECURITY.md)
  coacto-client --server tcp://host:5555 --model model.ctg --model-bytes model.onnx --input x.npy
  coacto-client --server tcp://127.0.0.1:5555 --model m.onnx --input x.npy --threads 1 \\
                --compute-cgroup /sys/fs/cgroup/cpu/slow-device     (a throttled device)
  coacto-client --server tcp://127.0.0.1:5555 --model resnet50 --random --policy dynamic \\
                --bandwidth 20mbit --trace t.json       (then open t.json in ui.perfetto.dev)
  coacto-client --server tcp://127.0.0.1:5555 --model resnet50 --random --transfer f16 \\
                --bandwidth 5mbit       (half the bytes; outputs within float16 rounding)
  coacto-client --server tcp://127.0.0.1:5555 --model resnet50 --random --bandwidth 2.5MB/s
                (the same cap as 20mbit, written in bytes)

policies: local (this device alone), cloud (send the whole input, then the server infers),
split (one split layer chosen from the estimates, its tensor sent whole), fl (fused-layer: the
first layers split spatially), dynamic (CoActo: tile by tile, transmission and computation
overlapped on both sides).
{rate_help}
With --json every inference prints one JSON object on stdout (latency_s,
tiles_local, tiles_sent, tiles_from_server, bytes_sent, tile_bytes_raw / tile_bytes_wire (the
sent tiles as float32 and as encoded), fallback, bandwidth_est_mbps, ...).
--trace writes the last inference (with --repeat) as one Chrome trace-event JSON of both sides on
this device's clock: the tiles each device and server thread computed, every TILES batch and
RESULT on the link with arrows from the tile sent to its first use, the scheduler's decisions
with both completion times, the estimates, the clock offset used. Open it in
https://ui.perfetto.dev or chrome://tracing, or draw it: experiments/plot_trace.py t.json.

Flags a mode does not use are named in a warning on stderr: with --policy local, the link flags
(--server, --bandwidth, --rtt-ms, --transfer, --timeout, the keys); with a .ctg model, --tiles and
--image-size (its tiles were fixed when it was compiled).

{exit_codes}.
""".format(rate_help=textwrap.fill(RATE_HELP, 99), exit_codes=exit_codes_help(width=99))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coacto-client", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Run a model on this device, offloading to a coacto server. The device can "
                    "always finish alone: a missing or stalled server means a local run "
                    "(\"fallback\": true), never a lost inference.")
    add_version(p, "coacto-client", protocol=True)
    p.add_argument("--server", metavar="ADDR",
                   help="the server's endpoint, tcp://host:port (not needed with --policy local)")
    p.add_argument("--server-key", metavar="KEY",
                   help="the server's public key: its .key file or the 40-character text the "
                        "server logs (default $COACTO_SERVER_KEY; needs --client-key)")
    p.add_argument("--client-key", metavar="FILE",
                   help="this device's .key_secret file from `coacto keygen`; its .key must be "
                        "in the server's allowed-keys folder (default $COACTO_CLIENT_KEY)")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="an ONNX file, a .ctg tile graph, or a zoo model name")
    p.add_argument("--model-bytes", metavar="ONNX",
                   help="with a .ctg model: its ONNX file, uploaded if the server lacks the model")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy | FILE.npz",
                   help="an input array (repeat for several inputs; an .npz holds them by name)")
    p.add_argument("--random", action="store_true", help="random inputs for those not given")
    p.add_argument("--policy", default="dynamic", metavar="P",
                   help=f"one of {', '.join(POLICIES)} (default: dynamic)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="computing threads on this device (default: all CPUs)")
    p.add_argument("--bandwidth", metavar="RATE",
                   help="cap this client's link, e.g. 20mbit or 2.5MB/s (units below); a "
                        "schedule changes it over time: 100mbit,5mbit@2.5 (5 Mbit/s from 2.5 s "
                        "after start)")
    p.add_argument("--rtt-ms", type=float, default=None, metavar="MS",
                   help="add this round-trip delay to the link, half each way (emulates a "
                        "distant server; with or without --bandwidth)")
    p.add_argument("--transfer", default=None, choices=["lossless", "f16", "int8", "raw"],
                   help="how tiles travel to the server: lossless (default: each tile's zeros "
                        "masked out, bit-exact), f16 or int8 (lossy, a half / a quarter of the "
                        "bytes; outputs differ by what the rounding costs), raw (float32)")
    p.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="inferences to run (default 1)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds without news from the server before finishing alone (default 5)")
    p.add_argument("--tiles", type=int, default=None, metavar="T",
                   help="tiles per layer (the server compiles the same; default: heuristic)")
    p.add_argument("--image-size", type=int, default=None, help="zoo models: the image size")
    p.add_argument("--compute-cgroup", metavar="DIR",
                   help="move the computing threads (only them) into this cgroup v1 cpu folder: "
                        "a slower device whose network stack is not throttled")
    p.add_argument("--output", metavar="OUT.npz", help="write the last outputs (ONNX names)")
    p.add_argument("--trace", metavar="T.json",
                   help="write a merged trace of the last inference, both sides (see below)")
    p.add_argument("--json", action="store_true", help="one JSON object per inference on stdout")
    p.add_argument("--verbose", "-v", action="count", default=0, help="log more (-vv: debug)")
    return p


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)


def join_cgroup(folder: Path, tids: list[int]) -> None:
    tasks = folder / "tasks"
    if not tids:
        raise InputError("--compute-cgroup: the computing threads' ids are unknown on this system")
    try:
        for tid in tids:
            tasks.write_text(str(tid))
    except OSError as e:
        raise InputError(f"--compute-cgroup {folder}: cannot write {tasks} ({e.strerror}); give a "
                         "cgroup v1 cpu folder this user may write (e.g. /sys/fs/cgroup/cpu/dev)")
    log.info("computing threads %s moved into %s", tids, folder)


def check_usage(args) -> None:
    """Every flag's value and combination, before any model is loaded: a usage error exits 2.
    Flags the chosen mode does not use are named in a warning."""
    from ..commands.shared import ignored_model_flags
    from .client import normalize_address
    from .shaper import describe_schedule

    if args.policy not in POLICIES:
        raise UsageError(f"unknown policy {args.policy!r} (--policy); choose one of "
                         f"{', '.join(POLICIES)}")
    positive(args.repeat, "--repeat")
    positive(args.threads, "--threads")
    positive(args.tiles, "--tiles")
    positive(args.image_size, "--image-size")
    if args.rtt_ms is not None and not (0 <= args.rtt_ms < 60_000):
        raise UsageError("--rtt-ms must lie between 0 and 60000 (milliseconds)")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be positive (seconds)")
    steps = rate_schedule(args.bandwidth) if args.bandwidth is not None else None
    local = args.policy == "local"
    if args.server is None and not local:
        raise UsageError(f"--policy {args.policy} needs --server tcp://host:port "
                         "(or use --policy local)")
    if args.server is not None:
        try:
            normalize_address(args.server)
        except CoactoError as e:
            raise UsageError(f"--server: {e}") from None
    for message in ignored_model_flags(args.model, tiles=args.tiles, image_size=args.image_size):
        warn("coacto-client", message)
    if local:
        link_flags = [flag for flag, value in (
            ("--server", args.server), ("--bandwidth", args.bandwidth),
            ("--rtt-ms", args.rtt_ms), ("--transfer", args.transfer),
            ("--timeout", args.timeout), ("--server-key", args.server_key),
            ("--client-key", args.client_key), ("--model-bytes", args.model_bytes))
            if value is not None]
        warn_ignored("coacto-client", link_flags, "with --policy local (nothing is sent)")
    elif steps is not None or args.rtt_ms:
        # The rate as read, in bits and bytes both: a unit read otherwise than meant shows
        # here, before any latency does.
        link = f"capped at {describe_schedule(steps)}" if steps else "uncapped"
        delay = f", {args.rtt_ms:g} ms added round trip" if args.rtt_ms else ""
        print(f"coacto-client: link {link}{delay}", file=sys.stderr, flush=True)


def run(args) -> int:
    from ..commands.shared import load_inputs, resolve_model
    from .client import Client, ServerUnavailable

    check_usage(args)
    if args.model_bytes is not None and not Path(args.model_bytes).is_file():
        raise InputError(f"--model-bytes {args.model_bytes}: no such file")
    if args.trace is not None and not Path(args.trace).resolve().parent.is_dir():
        raise InputError(f"--trace {args.trace}: its folder does not exist; create it first")
    # With a server, the graph it compiles too: the offloading partition (without this device's
    # tuned profile). On the device alone, the partition (and tuned profile) for local speed.
    alone = args.policy == "local"
    tg, onnx_bytes = resolve_model(args.model, args.tiles, None, args.image_size,
                                   threads=args.threads, use_tuned=alone,
                                   min_column_blocks=0 if alone else OFFLOAD_MIN_COLUMN_BLOCKS)
    feeds = load_inputs(args.input, tg, args.random)
    with Client(None if alone else args.server, tg, threads=args.threads, policy=args.policy,
                bandwidth=None if alone else args.bandwidth,
                timeout=5.0 if args.timeout is None else args.timeout,
                rtt_ms=0.0 if alone or args.rtt_ms is None else args.rtt_ms,
                model_bytes=args.model_bytes or onnx_bytes, transfer=args.transfer or "lossless",
                server_key=None if alone else args.server_key,
                client_key=None if alone else args.client_key) as client:
        if args.compute_cgroup:
            join_cgroup(Path(args.compute_cgroup), client.compute_threads)
        if args.server is not None and args.policy != "local":
            try:  # the handshake (and a first upload) before the first inference
                client.connect()
            except ServerUnavailable as e:
                log.warning("%s; inferences run on this device alone", e)
        outputs = None
        t0 = time.perf_counter()
        for i in range(args.repeat):
            last = i == args.repeat - 1
            outputs = client.infer(feeds, trace=args.trace if last and args.trace else False)
            stats = dict(client.last_stats, run=i)
            if args.json:
                print(json.dumps(stats, default=_json_default), flush=True)
            else:
                print(f"[{i + 1}/{args.repeat}] {stats['policy']}: "
                      f"{stats['latency_s'] * 1e3:.2f} ms, "
                      f"{stats['tiles_local']} tiles here, {stats['tiles_sent']} sent, "
                      f"{stats['tiles_from_server']} from the server"
                      + (f", {stats['tile_bytes_wire'] / 1e3:.1f} of {stats['tile_bytes_raw'] / 1e3:.1f}"
                         f" kB on the wire ({stats['transfer']})" if stats["tile_bytes_raw"] else "")
                      + (f" (fallback: {stats['fallback_reason']})" if stats["fallback"] else ""),
                      file=sys.stderr, flush=True)
        if not args.json:
            # on the device alone the link estimates are the untouched defaults: not shown
            link = "" if alone else (f"; goodput {client.estimates['bandwidth_est_mbps']:.3g} "
                                     f"Mbit/s, RTT {client.estimates['rtt_est_ms']:.3g} ms")
            print(f"{args.repeat} inference(s) in {time.perf_counter() - t0:.2f} s{link}",
                  file=sys.stderr)
    if args.output:
        out = Path(args.output)
        np.savez(out, **outputs)
        if not args.json:
            print(f"outputs written to {out}", file=sys.stderr)
    if args.trace and not args.json:
        print(f"trace of the last inference written to {args.trace} (open it in "
              "https://ui.perfetto.dev)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        return run(args)
    except UsageError as e:
        return usage_error("coacto-client", e)
    except (CoactoError, ValueError, OSError) as e:
        print(f"coacto-client: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("coacto-client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
