"""What the lossy tile transfers cost in accuracy, and what each encoding saves in bytes.

For each zoo model a real server on loopback and a client per transfer encoding (lossless, f16,
int8) run `cloud` (the input is what travels) and `split` at the first cut past half the
model's FLOPs (an activation travels), on several inputs, against onnxruntime on the same inputs:

- rel_err_max: the largest |output - onnxruntime| over max |onnxruntime|, over outputs and inputs;
- top1_agree: the share of inputs whose class (argmax of a classifier's output) is onnxruntime's;
  for BERT the share of tokens whose argmax over the hidden features is, and cos_min, the
  smallest cosine similarity of the pooled output;
- wire_share: the bytes of tile data sent over their float32 bytes.

The link plays no part in these numbers, so nothing is shaped. The zoo's weights are random:
top-1 agreement is over logits with no trained margin, a harder test than a trained model's.

    python experiments/transfer_accuracy.py --out experiments/results
    python experiments/transfer_accuracy.py --quick
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

MODELS = ("resnet50", "vgg16", "mobilenetv2", "bert")
TRANSFERS = ("lossless", "f16", "int8")


def half_flops_cut(tg) -> int:
    from coacto.partition import flops_per_layer, valid_cuts

    cum = np.cumsum(flops_per_layer(tg))
    inner = [c for c in valid_cuts(tg) if c not in tg.graph.inputs.values() and c < tg.n_layers - 1]
    return next((c for c in inner if cum[c] >= 0.5 * cum[-1]), inner[-1])


def compare(out: dict, ref: dict) -> dict:
    err = max(float(np.abs(out[k].astype(np.float64) - ref[k]).max()) /
              max(float(np.abs(ref[k]).max()), 1e-30) for k in ref)
    first = next(iter(ref))
    r, o = ref[first], out[first]
    if r.ndim == 2:  # a classifier: (batch, classes)
        agree = float(np.mean(np.argmax(o, -1) == np.argmax(r, -1)))
    else:  # a sequence (batch, tokens, features): per token
        agree = float(np.mean(np.argmax(o, -1) == np.argmax(r, -1)))
    cos = None
    if "pooler_output" in ref:
        a, b = out["pooler_output"].ravel(), ref["pooler_output"].ravel()
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
    return {"err": err, "agree": agree, "cos": cos}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="experiments/results", metavar="DIR",
                    help="folder for transfer_accuracy.csv and .settings.json (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="two models at small sizes, two inputs each (a first look, for CI)")
    ap.add_argument("--models", default=None, metavar="M,M",
                    help=f"zoo models (default: {','.join(MODELS)}; --quick: mobilenetv2,bert)")
    ap.add_argument("--inputs", type=int, default=None, metavar="N",
                    help="inputs per model (default: 8; --quick: 2)")
    ap.add_argument("--threads", type=int, default=1, help="server and client threads each")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from coacto import compile as compile_model, zoo
    from coacto.mobile.client import Client
    from coacto.partition import OFFLOAD_MIN_COLUMN_BLOCKS
    from coacto.server import Server

    models = (args.models.split(",") if args.models else
              (["mobilenetv2", "bert"] if args.quick else list(MODELS)))
    unknown = [m for m in models if m not in zoo.MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(sorted(zoo.MODELS))}")
    n_inputs = args.inputs or (2 if args.quick else 8)
    small = {"mobilenetv2": {"image_size": 96}, "resnet50": {"image_size": 96},
             "vgg16": {"image_size": 64},
             "bert": {"layers": 2, "hidden": 128, "heads": 4, "seq_len": 32, "vocab": 2000}}
    progress = H.Progress(len(models) * len(TRANSFERS) * 2 * n_inputs, "transfer accuracy")
    rows = []
    t0 = time.monotonic()
    # VGG-16 at 224 px is 553 MB of ONNX: over the default upload limit
    with Server("tcp://127.0.0.1:0", threads=args.threads, max_model_bytes=2 << 30) as srv:
        for name in models:
            proto = zoo.build(name, **(small.get(name, {}) if args.quick else {}))
            data = proto.SerializeToString()
            sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            feeds = [zoo.input_feeds(proto, seed=i) for i in range(n_inputs)]
            refs = [dict(zip(names, sess.run(names, f))) for f in feeds]
            tg = compile_model(data, min_column_blocks=OFFLOAD_MIN_COLUMN_BLOCKS)
            cut = half_flops_cut(tg)
            for transfer in TRANSFERS:
                for policy in ("cloud", "split"):
                    with Client(srv.address, tg, threads=args.threads, policy=policy,
                                split_layer=cut if policy == "split" else None, timeout=60,
                                model_bytes=data, transfer=transfer) as client:
                        client.connect(120)
                        stats, res = [], []
                        for f, ref in zip(feeds, refs):
                            res.append(compare(client.infer(f), ref))
                            stats.append(client.last_stats)
                            progress.step(1, f"{name} {transfer} {policy}")
                    raw = sum(s["tile_bytes_raw"] for s in stats)
                    wire = sum(s["tile_bytes_wire"] for s in stats)
                    cos = [r["cos"] for r in res if r["cos"] is not None]
                    rows.append({
                        "model": name, "transfer": transfer, "policy": policy,
                        "sent": "input" if policy == "cloud" else tg.graph.layers[cut].name,
                        "inputs": n_inputs, "rel_err_max": max(r["err"] for r in res),
                        "top1_agree": float(np.mean([r["agree"] for r in res])),
                        "cos_min": min(cos) if cos else "",
                        "wire_share": wire / raw if raw else "",
                        "fallbacks": sum(bool(s["fallback"]) for s in stats),
                    })
    progress.close()
    settings = {"models": models, "inputs": n_inputs, "quick": args.quick,
                "threads": args.threads, "seconds": round(time.monotonic() - t0, 1),
                "how": "in-process Server and Client on loopback, unshaped; onnxruntime on the "
                       "same inputs; split at the first cut past half the FLOPs"}
    path = H.write_table(Path(args.out), "transfer_accuracy", rows, settings)
    print(f"{'model':12} {'transfer':9} {'policy':6} {'rel_err_max':>11} {'top1':>5} "
          f"{'cos_min':>8} {'wire':>5}")
    for r in rows:
        cos = f"{r['cos_min']:.5f}" if r["cos_min"] != "" else ""
        wire = f"{r['wire_share']:.3f}" if r["wire_share"] != "" else ""
        print(f"{r['model']:12} {r['transfer']:9} {r['policy']:6} {r['rel_err_max']:11.2e} "
              f"{r['top1_agree']:5.2f} {cos:>8} {wire:>5}")
    print(f"written to {path}", file=sys.stderr)
    bad = [r for r in rows if r["transfer"] == "lossless" and r["rel_err_max"] > 1e-4]
    if bad or any(r["fallbacks"] for r in rows):
        print("lossless outputs off by more than 1e-4, or inferences that fell back: "
              f"{bad or [r for r in rows if r['fallbacks']]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
