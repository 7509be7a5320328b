"""coacto as an ONNX backend: ``onnx.backend.base.Backend``'s interface, so that onnx's own
backend tests (``onnx.backend.test.BackendTest(coacto.backend)``) and tools written for that
interface can run models on coacto.

    import coacto.backend
    rep = coacto.backend.prepare(model)           # a ModelProto
    y, = rep.run([x])                             # inputs in the order of model.graph.input

A backend sees the input values at run time, which a compiler does not: many ONNX test models
pass as graph inputs what exported models hold as initializers (Reshape's shape, Slice's bounds,
Pad's pads, Gemm's B, Conv's weights). coacto needs those constant, so when a model does not
compile with every input live, ``run`` folds inputs into initializers holding the values given
and compiles that model instead; the compiled graphs are cached by the inputs folded and their
values. A model that compiles with its inputs live is never folded.

Inputs and outputs come in and back in their declared types, as from onnxruntime: float16 and
float64 tensors are computed in float32 (as ``coacto.compile`` computes them), integer and bool
outputs of integer inputs, comparisons and casts are exact. What coacto cannot carry (bfloat16,
float8, integer outputs of values not whole by construction, ranks above 8) is refused with
coacto's error, as ``coacto.compile`` refuses it.
"""
from __future__ import annotations

import hashlib
import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .compiler import compile as _compile
from .errors import CoactoError, InputError, UnsupportedOperatorError
from .runtime import Runtime

log = logging.getLogger(__name__)

#: Compiled graphs kept per prepared model: a test feeds a handful of value sets, a long-lived
#: caller varying folded inputs (shapes, say) on every call should not grow without bound.
_CACHE_LIMIT = 16


class CoactoRep(BackendRep):
    """A prepared model. ``run(inputs)`` takes a list (in the order of the model's non-initializer
    inputs), a dict {name: array} or one array, and returns the outputs as onnx's named tuple."""

    def __init__(self, model: onnx.ModelProto, threads: int = 1):
        self.model = model
        self.threads = threads
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        #: the inputs folded into initializers, once a run found a set that compiles
        self.folded: tuple[str, ...] | None = None
        self._runtimes: dict[tuple, Runtime] = {}

    # -- feeding
    def _feeds(self, inputs) -> dict[str, np.ndarray]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
            missing = [n for n in self.input_names if n not in feeds]
            if missing:
                raise InputError(f"missing input(s) {missing}; the model takes {self.input_names}")
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise InputError(f"the model takes {len(self.input_names)} input(s) "
                                 f"{self.input_names}, got {len(inputs)}")
            feeds = dict(zip(self.input_names, inputs))
        out = {}
        for name, value in feeds.items():
            if isinstance(value, (list, tuple, dict)) or value is None:
                raise InputError(f"input {name!r} is a {type(value).__name__}; coacto runs models "
                                 "on tensors only, not on sequences, maps or optionals")
            out[name] = np.asarray(value)
        return out

    def run(self, inputs, **kwargs) -> tuple:
        feeds = self._feeds(inputs)
        runtime, folded = self._runtime_for(feeds)
        live = {k: v for k, v in feeds.items() if k not in folded}
        outs = runtime.run(self.output_names, live)
        return namedtupledict("Outputs", self.output_names)(*outs)

    # -- compiling
    def _candidates(self, feeds) -> list[tuple[str, ...]]:
        """Sets of inputs to fold, tried in order: none; the non-float32 and rank-0 ones (shapes,
        axes, indices, scalars); every input but one (the data), the first one first. Empty
        inputs (a CastLike's type donor, say) are folded in every set after the first: coacto
        computes on tensors of at least one element. One input at least stays live."""
        names = self.input_names
        empty = {n for n in names if feeds[n].size == 0}
        odd = [n for n in names if feeds[n].dtype != np.float32 or feeds[n].ndim == 0]
        sets = [odd] + [[n for n in names if n != keep] for keep in names]
        seen, out = {()}, [()]
        for s in sets:
            folded = tuple(n for n in names if n in empty or n in s)
            if folded not in seen and len(folded) < len(names):
                seen.add(folded)
                out.append(folded)
        return out

    def _runtime_for(self, feeds):
        if self.folded is not None:
            return self._runtime(self.folded, feeds), self.folded
        refusals = []
        for folded in self._candidates(feeds):
            try:
                runtime = self._runtime(folded, feeds)
            except CoactoError as e:
                if not refusals and not _foldable(e):
                    raise
                log.debug("inputs %s folded: %s", folded, e)
                refusals.append((folded, e))
                continue
            self.folded = folded
            return runtime, folded
        # The first folding's refusal tells more than the first one: shapes and axes are
        # constants there, so what remains is what coacto lacks.
        folded, e = refusals[min(1, len(refusals) - 1)]
        if folded:
            e.args = (f"{e} [the inputs {list(folded)} folded into initializers]",) + e.args[1:]
        raise e

    def _runtime(self, folded: tuple[str, ...], feeds):
        digest = hashlib.sha256()
        for name in folded:
            v = np.ascontiguousarray(feeds[name])
            digest.update(f"{name}|{v.dtype.str}|{v.shape}|".encode())
            digest.update(v.tobytes())
        key = (folded, digest.hexdigest())
        runtime = self._runtimes.get(key)
        if runtime is None:
            model = self.model if not folded else _fold_inputs(self.model, folded, feeds)
            runtime = Runtime(_compile(model), threads=self.threads)
            if len(self._runtimes) >= _CACHE_LIMIT:
                self._runtimes.pop(next(iter(self._runtimes)))
            self._runtimes[key] = runtime
        return runtime


def _foldable(e: CoactoError) -> bool:
    """Whether folding inputs may help: not when the only refusals are of output types or ranks,
    which no folding changes."""
    if isinstance(e, UnsupportedOperatorError) and e.nodes:
        return any(op != "Output" for _, op in e.nodes)
    return True


def _fold_inputs(model: onnx.ModelProto, folded, feeds) -> onnx.ModelProto:
    """The model with the inputs ``folded`` turned into initializers holding the values fed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    keep = [i for i in g.input if i.name not in folded]
    del g.input[:]
    g.input.extend(keep)
    for name in folded:
        g.initializer.append(numpy_helper.from_array(np.asarray(feeds[name]), name))
    return out


class CoactoBackend(Backend):
    """onnx's backend interface over coacto.compile and coacto.Runtime (CPU only)."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", threads: int = 1, **kwargs) -> CoactoRep:
        """``model``: a ModelProto, its bytes or a path. Compiling waits for the first run, which
        knows the values of inputs the model needs constant. ``threads``: computing threads."""
        if not cls.supports_device(device):
            raise CoactoError(f"coacto runs on the CPU, not on {device!r}")
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load_model_from_string(model) if isinstance(model, bytes) \
                else onnx.load(model)
        return CoactoRep(model, threads=threads)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs, device: str = "CPU", outputs_info=None,
                 **kwargs) -> tuple:
        """Runs one node on ``inputs`` (a list in the order of node.input): the node becomes a
        model of the default opset (``opset_version`` to choose) whose output types come from
        onnx's shape inference, or from ``outputs_info`` [(dtype, shape), ...] when given."""
        values = [np.asarray(v) for v in (inputs.values() if isinstance(inputs, dict) else inputs)]
        names = [n for n in node.input if n]
        ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
               for n, v in zip(names, values)]
        if outputs_info:
            outs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)),
                                                  s)
                    for n, (t, s) in zip(node.output, outputs_info)]
        else:
            outs = [helper.make_empty_tensor_value_info(n) for n in node.output]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(helper.make_graph([node], "node", ins, outs),
                                  opset_imports=[helper.make_opsetid("", opset)])
        if not outputs_info:
            inferred = onnx.shape_inference.infer_shapes(model)
            del model.graph.output[:]
            model.graph.output.extend(inferred.graph.output)
        return cls.prepare(model, device, **kwargs).run(dict(zip(names, values)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except AttributeError:
            return False


prepare = CoactoBackend.prepare
run_model = CoactoBackend.run_model
run_node = CoactoBackend.run_node
supports_device = CoactoBackend.supports_device
is_compatible = CoactoBackend.is_compatible
