"""Draws a coacto trace (Chrome trace-event JSON, as `coacto-client --trace` writes it) as a Gantt
chart: one row per device thread, link lane and server thread, tiles coloured by their layer's
depth in the network, the tiles sent and returned as thin lines from where they were produced to
where they were first used, the scheduler's decisions as ticks on the thread that made them.

Needs matplotlib (`pip install matplotlib`). Exit codes: 0 written, 1 unreadable trace, 2 usage.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """\
example:
  coacto-client --server tcp://127.0.0.1:5555 --model resnet50 --input data=img.npy \\
                --policy dynamic --bandwidth 20mbit --trace t.json
  python experiments/plot_trace.py t.json -o t.png
  python experiments/plot_trace.py t.json -o t.png --no-flows --width 20 --from-ms 0 --to-ms 50

rows, top to bottom: device (inference, engine, worker N), link (uplink N: a TILES batch from
when it was handed to the link until the server took it in; downlink N: a RESULT), server
(inference, I/O, worker N). Ticks on device workers: send decisions (red: sent, black: kept).
"""


def load(path: Path) -> dict:
    with open(path) as f:
        trace = json.load(f)
    if isinstance(trace, list):  # the array form of the format
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a trace-event file (no traceEvents list)")
    return trace


def rows_of(events: list) -> tuple[list, dict]:
    """The rows to draw, in the processes' and threads' sort order: [(pid, tid)], labels."""
    proc_name, proc_sort, thread_name, thread_sort = {}, {}, {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        args, key = e.get("args", {}), (e.get("pid"), e.get("tid"))
        if e["name"] == "process_name":
            proc_name[e["pid"]] = args.get("name", str(e["pid"]))
        elif e["name"] == "process_sort_index":
            proc_sort[e["pid"]] = args.get("sort_index", 0)
        elif e["name"] == "thread_name":
            thread_name[key] = args.get("name", str(e.get("tid")))
        elif e["name"] == "thread_sort_index":
            thread_sort[key] = args.get("sort_index", 0)
    used = {(e.get("pid"), e.get("tid")) for e in events if e.get("ph") in ("X", "i", "I")}
    rows = sorted(used, key=lambda k: (proc_sort.get(k[0], k[0]), thread_sort.get(k, k[1] or 0)))
    labels = {k: f"{proc_name.get(k[0], k[0])} · {thread_name.get(k, k[1])}" for k in rows}
    return rows, labels


def plot(trace: dict, out: Path, width: float = 16.0, flows: bool = True,
         t_from: float | None = None, t_to: float | None = None, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    events = trace["traceEvents"]
    meta = trace.get("metadata", {}).get("coacto", {})
    rows, labels = rows_of(events)
    if not rows:
        raise ValueError("the trace has no slices to draw")
    y = {k: i for i, k in enumerate(rows)}
    n_layers = meta.get("layers") or 1 + max((e.get("args", {}).get("depth", 0) for e in events
                                              if e.get("ph") == "X"), default=0)
    cmap, norm = cm.viridis, colors.Normalize(0, max(1, n_layers - 1))

    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.32 * len(rows)))
    bars: dict = {}
    ends = {}  # (pid, tid, ts) -> end of the slice starting there, to draw flows from its end
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e["pid"], e["tid"])
        ts, dur = e["ts"] / 1e3, max(e.get("dur", 0.0), 0.0) / 1e3
        ends[(*key, e["ts"])] = (e["ts"] + e.get("dur", 0.0)) / 1e3
        depth = e.get("args", {}).get("depth")
        if depth is not None:
            color = cmap(norm(depth))
        elif e["name"].startswith(("TILES", "RESULT")):
            color = "#4a90d9" if e["name"].startswith("TILES") else "#e67e22"
        elif "inference" in e["name"]:
            color = "#d5d8dc"
        else:
            color = "#7f8c8d"
        bars.setdefault(key, ([], []))
        bars[key][0].append((ts, max(dur, 1e-4)))
        bars[key][1].append(color)
    for key, (spans, cols) in bars.items():
        ax.broken_barh(spans, (y[key] - 0.4, 0.8), facecolors=cols, edgecolors="none")

    if flows:
        starts = {}
        for e in events:
            if e.get("ph") == "s":
                starts[e["id"]] = e
        for e in events:
            s = starts.get(e.get("id")) if e.get("ph") == "f" else None
            if s is None or (s["pid"], s["tid"]) not in y or (e["pid"], e["tid"]) not in y:
                continue
            x0 = ends.get((s["pid"], s["tid"], s["ts"]), s["ts"] / 1e3)
            x1 = e["ts"] / 1e3
            back = e["pid"] < s["pid"]  # server to device: a RESULT
            ax.plot([x0, x1], [y[(s["pid"], s["tid"])], y[(e["pid"], e["tid"])]],
                    color="#e67e22" if back else "#c0392b", lw=0.4, alpha=0.5)

    ticks = {True: ([], []), False: ([], [])}
    for e in events:
        if e.get("ph") == "i" and e.get("cat") == "decision" and (e["pid"], e["tid"]) in y:
            sent = bool(e.get("args", {}).get("sent"))
            ticks[sent][0].append(e["ts"] / 1e3)
            ticks[sent][1].append(y[(e["pid"], e["tid"])])
    for sent, (xs, ys) in ticks.items():
        if xs:  # above the tiles they follow, not over them: most tiles have one
            ax.scatter(xs, [v - 0.42 for v in ys], marker="|", s=60 if sent else 25,
                       linewidths=1.6 if sent else 0.5, color="#c0392b" if sent else "#555555",
                       zorder=3, label="decision: send" if sent else "decision: keep")

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([labels[k] for k in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the inference was submitted (device clock)")
    if t_from is not None or t_to is not None:
        ax.set_xlim(left=t_from, right=t_to)
    ax.grid(axis="x", lw=0.3, alpha=0.5)
    if title is None:
        clock = meta.get("clock", {})
        lat = meta.get("latency_s")
        title = (f"{meta.get('policy', '?')}: {lat * 1e3:.1f} ms" if lat is not None else "trace")
        title += (f" — {meta.get('tiles_local', '?')} tiles on the device, "
                  f"{meta.get('tiles_sent', '?')} sent, {meta.get('tiles_from_server', '?')} back"
                  f"; link {meta.get('bandwidth_est_mbps') or 0:.3g} Mbit/s, "
                  f"RTT {meta.get('rtt_est_ms') or 0:.2g} ms")
        if clock.get("offset_s") is not None:
            unc = clock.get("uncertainty_s")
            title += (f"\nserver clock offset {clock['offset_s'] * 1e3:+.3f} ms"
                      + (f" ± {unc * 1e3:.3f} ms" if unc is not None else "")
                      + f" ({clock.get('source')})")
    ax.set_title(title, fontsize=9)
    sm = cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(sm, ax=ax, pad=0.01, fraction=0.02).set_label("layer depth", fontsize=8)
    if any(ticks[k][0] for k in ticks):
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="plot_trace.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=EPILOG)
    p.add_argument("trace", type=Path, help="a trace-event JSON (coacto-client --trace)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="the PNG to write (default: the trace's name with .png)")
    p.add_argument("--width", type=float, default=16.0, help="figure width in inches (default 16)")
    p.add_argument("--no-flows", action="store_true",
                   help="leave out the lines of the tiles sent and returned")
    p.add_argument("--from-ms", type=float, default=None, help="start of the time axis")
    p.add_argument("--to-ms", type=float, default=None, help="end of the time axis")
    p.add_argument("--title", default=None, help="replace the title (policy, latency, clock)")
    args = p.parse_args(argv)
    out = args.output or args.trace.with_suffix(".png")
    try:
        trace = load(args.trace)
        plot(trace, out, args.width, not args.no_flows, args.from_ms, args.to_ms, args.title)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot_trace.py: error: {args.trace}: {e}", file=sys.stderr)
        return 1
    except ImportError:
        print("plot_trace.py: error: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1
    print(f"{out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
