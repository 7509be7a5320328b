"""What the `coacto` subcommands share: finding and compiling the model a command names, the flags
that shape it, loading inputs, and comparing outputs with onnxruntime's."""
from __future__ import annotations

import hashlib
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from .. import benchmark, compiler
from ..cli_common import UsageError, positive, warn
from ..errors import CoactoError, InputError


def para(text: str) -> str:
    """Help text wrapped for the terminal (the raw formatters keep line breaks as written)."""
    return textwrap.fill(text, 79)


def progress(msg: str) -> None:
    """A line of progress on stderr, so stdout stays the result (--json included)."""
    print(msg, file=sys.stderr, flush=True)


def resolve_model(spec: str, tiles_per_layer=None, input_shapes=None, image_size=None,
                  threads: int | None = None, use_tuned: bool = True, min_column_blocks: int = 0):
    """A .ctg file, an .onnx file, or the name of a zoo model -> (TileGraph, onnx bytes or None).

    An ONNX model is compiled with the tile counts of the profile `coacto tune` stored for it on
    this machine and thread count, when there is one, use_tuned is set, and neither --tiles nor
    --shape overrides the partition. A local graph (``min_column_blocks`` 0) is partitioned for
    ``threads`` (default: coacto.runtime.default_threads()); ``min_column_blocks``: see
    coacto.compile (graphs for offloading)."""
    path = Path(spec)
    if path.suffix == ".ctg":
        return compiler.load(path), None
    if path.exists() or path.suffix == ".onnx":
        if not path.exists():
            raise CoactoError(f"{spec}: no such file")
        data = path.read_bytes()
        label = path.name
    else:
        from .. import zoo

        if spec not in zoo.MODELS:
            raise CoactoError(f"{spec}: no such file, and not a zoo model "
                              f"(zoo: {', '.join(zoo.MODELS)})")
        kw = {"image_size": image_size} if image_size else {}
        progress(f"building zoo model {spec} ...")
        data = zoo.build(spec, **kw).SerializeToString()
        label = spec
    from ..runtime import default_threads

    t = threads or default_threads()
    layer_tiles = None
    if use_tuned and tiles_per_layer is None and not input_shapes:
        from .. import tune

        model_hash = hashlib.sha256(data).hexdigest()
        prof = tune.load_profile(model_hash, t)
        layer_tiles = tune.layer_tiles_of(prof)
        if layer_tiles:
            progress(f"using the tuned tile counts of {tune.profile_path(model_hash, t)} "
                      f"(measured {prof['ratio']:.2f}x the default's latency at {t} threads; "
                      f"--no-tuned ignores it)")
    t0 = time.perf_counter()
    # A local graph is partitioned for the threads that will run it; one for offloading is not
    # (the server computes it with threads of its own).
    tg = compiler.compile(data, tiles_per_layer=tiles_per_layer, input_shapes=input_shapes,
                          layer_tiles=layer_tiles, min_column_blocks=min_column_blocks,
                          threads=None if min_column_blocks else t)
    progress(f"compiled {label}: {tg.n_layers} layers, {tg.n_tiles} tiles "
              f"in {time.perf_counter() - t0:.2f} s")
    return tg, data


def ignored_model_flags(spec: str, tiles=None, shape=None, image_size=None,
                        no_tuned: bool = False) -> list[str]:
    """Why each model flag given goes unused with this model, one sentence per flag: a .ctg's
    tiles and shapes were fixed when it was compiled, and only zoo models are built at a size."""
    path = Path(spec)
    if path.suffix == ".ctg":
        given = [flag for flag, value in (("--tiles", tiles), ("--shape", shape),
                                          ("--image-size", image_size)) if value]
        given += ["--no-tuned"] if no_tuned else []
        return [f"{flag} is ignored with {spec}: a .ctg's tiles and input shapes were fixed when "
                f"it was compiled (`coacto compile` takes {flag})" for flag in given]
    if image_size and (path.exists() or path.suffix == ".onnx"):
        return [f"--image-size is ignored with {spec}: it sizes zoo models only (an ONNX file "
                "with dynamic dimensions takes --shape NAME=1,3,H,W)"]
    return []


def parse_shapes(items) -> dict | None:
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name] = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            raise UsageError(f"--shape {item!r}: write NAME=1,3,224,224") from None
    return out


def load_inputs(items, graph, random: bool, seed: int = 0) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep:
            file, name = item, None
        p = Path(file)
        if not p.exists():
            raise InputError(f"--input {item}: {file} does not exist")
        try:
            loaded = np.load(p, allow_pickle=False)
        except Exception as e:
            raise InputError(f"--input {item}: cannot read {file} as .npy/.npz ({e})") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            feeds.update({k: loaded[k] for k in loaded.files})
        else:
            if name is None:
                if len(graph.inputs) != 1:
                    raise InputError(f"--input {file}: the model has inputs {list(graph.inputs)}; "
                                     f"write NAME={file}")
                name = next(iter(graph.inputs))
            feeds[name] = loaded
    if random:
        for name, value in graph.example_feeds(seed).items():
            feeds.setdefault(name, value)
    if not feeds:
        raise InputError("no input given: pass --input NAME=FILE.npy (or FILE.npz), or --random "
                         f"(the model's inputs: {dict(graph.inputs)})")
    return feeds


def check_model_flags(args, shapes_allowed: bool = True) -> None:
    """The model flags every command shares: values, and a warning for each one unused."""
    positive(getattr(args, "threads", None), "--threads")
    positive(getattr(args, "tiles", None), "--tiles")
    positive(getattr(args, "image_size", None), "--image-size")
    for message in ignored_model_flags(args.model, getattr(args, "tiles", None),
                                       getattr(args, "shape", None),
                                       getattr(args, "image_size", None),
                                       getattr(args, "no_tuned", False)):
        warn("coacto", message)


def check_reference(onnx_bytes: bytes | None, tg, reference: str | None) -> bytes:
    """The ONNX model run --check compares against: the one the model came from, or --reference
    (which must be the ONNX the tile graph was compiled from: its sha256 is in the graph)."""
    if reference is None:
        return onnx_bytes
    if not Path(reference).is_file():
        raise CoactoError(f"--reference {reference}: no such file")
    data = Path(reference).read_bytes()
    if hashlib.sha256(data).hexdigest() != tg.model_hash:
        raise CoactoError(f"--reference {reference} is not the ONNX model this tile graph was "
                          "compiled from (sha256 differs); pass that same .onnx file")
    return data


def compare_outputs(outputs: dict, reference: dict) -> dict:
    """Each output against onnxruntime's: max |error| within 1e-4 of max |reference|."""
    rows = {}
    for name, value in outputs.items():
        err, scale = benchmark.max_error(value, reference[name])
        rows[name] = {"max_error": err, "max_reference": scale, "match": bool(err <= 1e-4 * scale)}
    return rows


def onnxruntime_reference(model: bytes, feeds: dict, rt) -> dict:
    """onnxruntime's outputs for ``feeds``, each cast to the type the model declares (coacto
    takes any integer type for an int64 input; onnxruntime only the declared one)."""
    typed = {a.name: np.asarray(feeds[a.name]).astype(a.dtype, copy=False)
             for a in rt.get_inputs() if a.name in feeds}
    try:
        ref, _ = benchmark.onnxruntime_run(model, typed, rt.threads, 0)
    except CoactoError:
        raise
    except Exception as e:  # onnxruntime's own errors: the reference cannot run, say why
        raise CoactoError(f"--check: onnxruntime cannot run the reference model: "
                          f"{type(e).__name__}: {str(e)[:300]}") from None
    return ref


def int_list(text: str, what: str) -> list[int]:
    """A comma-separated list of positive integers (--threads 1,2); else a usage error."""
    try:
        values = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"{what} {text!r}: write positive integers separated by commas, e.g. 1,2")
    return values


def model_args(sp, tiles_help=True):
    """--tiles, --shape and --image-size: how a model is partitioned and built."""
    sp.add_argument("--tiles", type=int, default=None, metavar="T",
                    help="tiles per layer (default: a FLOP-based heuristic)")
    sp.add_argument("--shape", action="append", metavar="NAME=D0,D1,..",
                    help="static shape for an input with dynamic dimensions (repeatable)")
    sp.add_argument("--image-size", type=int, default=None,
                    help="image size when MODEL is a zoo name")


def tuned_arg(sp):
    """--no-tuned: compile without the tile counts `coacto tune` stored."""
    sp.add_argument("--no-tuned", action="store_true",
                    help="ignore the tile counts `coacto tune` stored for this model, machine "
                         "and thread count (they are used by default when present)")
