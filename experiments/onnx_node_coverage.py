#!/usr/bin/env python3
"""How many of onnx's backend node tests coacto passes, per operator and in total.

Runs every node test the installed onnx package generates (onnx.backend.test.loader; no
downloads) through coacto.backend, the way onnx's test runner does (prepare, run each data set,
compare shape, dtype and values at the test's tolerances), and prints passed / total per operator,
the total, and the total over the common CNN and transformer operators (COMMON_OPS). A test's
operator is its node's op type; for a test whose graph has several nodes (an ``_expanded`` test
spells the operator out as its function body) it is the operator its name starts with.

Examples:
  python experiments/onnx_node_coverage.py                 # the table
  python experiments/onnx_node_coverage.py --failures      # and why each failing test fails
  python experiments/onnx_node_coverage.py --ops Conv Gemm --failures
  python experiments/onnx_node_coverage.py --json          # one object, for programs

Exit codes: 0 done, 2 bad arguments.
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# this checkout's coacto, not another one an editable install points to
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: The operators CNNs and transformers are exported with, the basis of the "common" total.
COMMON_OPS = frozenset({
    # convolutions, pooling, normalisation
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "BatchNormalization", "InstanceNormalization", "LayerNormalization", "LRN",
    # activations
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softplus", "Gelu", "Erf", "Clip", "Softmax", "LogSoftmax",
    # linear algebra and element-wise arithmetic
    "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Neg",
    "ReduceMean", "ReduceSum", "ReduceMax",
    # shapes and indexing
    "Reshape", "Transpose", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze", "Flatten",
    "Gather", "Expand", "Pad", "Resize", "Where", "Dropout", "Identity",
})

#: Operator families for the summary lines (operators outside them count in the total only).
FAMILIES = {
    "convolution and pooling": "Conv ConvTranspose MaxPool AveragePool GlobalAveragePool "
                               "GlobalMaxPool LpPool MaxUnpool DeformConv Col2Im",
    "normalisation": "BatchNormalization InstanceNormalization LayerNormalization "
                     "GroupNormalization RMSNormalization LRN LpNormalization "
                     "MeanVarianceNormalization",
    "activations": "Relu LeakyRelu PRelu Elu Selu Celu Sigmoid HardSigmoid HardSwish Tanh Softplus "
                   "Softsign Gelu Erf Clip Softmax LogSoftmax Hardmax ThresholdedRelu Mish Swish "
                   "Shrink SwiGLU",
    "element-wise arithmetic": "Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Ceil Floor "
                               "Round Sign Max Min Mean Sum Mod Sin Cos Tan Asin Acos Atan Sinh "
                               "Cosh Asinh Acosh Atanh",
    "matrix products": "MatMul Gemm Einsum MatMulInteger",
    "reductions": "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 "
                  "ReduceLogSum ReduceLogSumExp ReduceSumSquare ArgMax ArgMin CumSum CumProd TopK",
    "shapes and indexing": "Reshape Transpose Concat Split Slice Squeeze Unsqueeze Flatten Gather "
                           "GatherElements GatherND Expand Pad Tile Resize Upsample DepthToSpace "
                           "SpaceToDepth Where Identity Dropout Shape Size Trilu CenterCropPad "
                           "ScatterElements ScatterND Scatter",
    "attention": "Attention RotaryEmbedding FlexAttention LinearAttention CausalConvWithState",
}


def load_cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():  # onnx's generators overflow casts on purpose
        warnings.simplefilter("ignore")
        np_err = np.seterr(all="ignore")
        try:
            return load_model_tests(kind="node")
        finally:
            np.seterr(**np_err)


def schema_names() -> list[str]:
    import onnx

    names = {s.name for s in onnx.defs.get_all_schemas_with_history()
             if s.domain in ("", "ai.onnx")}
    return sorted(names, key=len, reverse=True)


def operator_of(case, schemas: list[str]) -> str:
    """The operator a node test exercises."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return nodes[0].op_type
    key = case.name[len("test_"):].replace("_", "").lower()
    for name in schemas:
        if key.startswith(name.lower()):
            return name
    return nodes[0].op_type if nodes else "?"


#: Why a node test fails, from coacto's refusal: (group, what in the refusal says so), first
#: match wins. The groups of the expected failures in tests/test_onnx_backend.py.
FAILURE_GROUPS = [
    ("opset below 9", ("coacto reads opsets",)),
    ("sequence, map or optional values", ("not on sequences", "input of type non-tensor",
                                          "Sequence", "Optional")),
    ("operator not supported", ("operator is not supported", "operator of domain",
                                "declares no version of the standard ONNX operator set")),
    ("operator supported on constants only", ("supported on constants only",)),
    ("non-float32 input", ("input of type",)),
    ("non-float32 output", ("TensorProto.", "casts computed data to")),
    ("rank above 8", ("of rank", "has rank")),
    ("empty tensor", ("has a dimension 0",)),
    ("output does not depend on an input", ("is a constant",)),
    ("wrong values", ("Not equal to tolerance", "Mismatched elements")),
]


def failure_group(detail: str) -> str:
    for group, needles in FAILURE_GROUPS:
        if any(n in detail for n in needles):
            return group
    return "operator form not supported"


def run_case(backend, case) -> tuple[str, str]:
    """("pass" | "fail" | "error", detail) for one node test, as onnx's runner judges it."""
    from onnx.backend.test.runner import Runner, _normalize_tensor

    try:
        rep = backend.prepare(case.model, "CPU")
        for inputs, ref_outputs in case.data_sets:
            outs = rep.run([_normalize_tensor(x) for x in inputs])
            Runner.assert_similar_outputs([_normalize_tensor(x) for x in ref_outputs], outs,
                                          rtol=case.rtol, atol=case.atol)
    except AssertionError as e:
        return "fail", " ".join(str(e).split())[:300]
    except Exception as e:  # noqa: BLE001 - every refusal is a result to report
        return "error", f"{type(e).__name__}: " + " ".join(str(e).split())[:300]
    return "pass", ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--ops", nargs="*", help="only these operators")
    ap.add_argument("--failures", action="store_true", help="print each failing test and why")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)

    import coacto.backend as backend

    logging_off()
    cases = load_cases()
    schemas = schema_names()
    per_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    results = []
    t0 = time.perf_counter()
    for i, case in enumerate(cases):
        op = operator_of(case, schemas)
        if args.ops and op not in args.ops:
            continue
        status, detail = run_case(backend, case)
        per_op[op][1] += 1
        per_op[op][0] += status == "pass"
        results.append({"test": case.name, "op": op, "status": status, "detail": detail,
                        "group": None if status == "pass" else failure_group(detail)})
        if not args.json and sys.stderr.isatty():
            print(f"\r{i + 1}/{len(cases)}", end="", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    if not args.json and sys.stderr.isatty():
        print(file=sys.stderr)

    def total(ops) -> list[int]:
        return [sum(per_op[o][0] for o in ops), sum(per_op[o][1] for o in ops)]

    summary = {"onnx": _onnx_version(), "seconds": round(seconds, 1),
               "total": total(per_op), "common": total([o for o in per_op if o in COMMON_OPS]),
               "families": {f: total([o for o in ops.split() if o in per_op])
                            for f, ops in FAMILIES.items()},
               "per_op": {o: per_op[o] for o in sorted(per_op)},
               "failure_groups": dict(collections.Counter(
                   r["group"] for r in results if r["group"]).most_common())}
    if args.json:
        summary["tests"] = results
        print(json.dumps(summary, indent=1))
        return 0
    if args.failures:
        for r in results:
            if r["status"] != "pass":
                print(f"{r['test']:<58} {r['op']:<22} {r['group']}: {r['detail']}")
        print()
    width = max((len(o) for o in per_op), default=8)
    print(f"{'operator':<{width}}  passed / tests")
    for o in sorted(per_op):
        p, n = per_op[o]
        mark = "*" if o in COMMON_OPS else " "
        print(f"{o:<{width}}{mark} {p:>6} / {n:<5}")
    p, n = summary["total"]
    cp, cn = summary["common"]
    print("\nfailing tests by cause:")
    for group, count in summary["failure_groups"].items():
        print(f"  {count:>5}  {group}")
    print("\nby family:")
    for family, (fp, fn) in summary["families"].items():
        print(f"  {family:<26} {fp:>5} / {fn}")
    print(f"\nall node tests: {p} / {n} pass; the common CNN/transformer operators (*): {cp} / {cn}"
          f" (onnx {summary['onnx']}, {seconds:.0f} s)")
    return 0


def logging_off() -> None:
    import logging

    logging.getLogger("coacto").setLevel(logging.ERROR)  # the opset-range warnings, per test


def _onnx_version() -> str:
    import onnx

    return onnx.__version__


if __name__ == "__main__":
    sys.exit(main())
