"""Fusions on an imported layer list, before partitioning.

- AFFINE (BatchNormalization, per-channel Mul / Add) into the preceding CONV: scaled weights and
  bias; into a preceding AFFINE without activation or a LAYERNORM: one affine;
- activations (AFFINE with scale 1, shift 0) into their CONV / BINARY / AFFINE producer;
- ``Add(conv, other)`` of equal shapes into the CONV as its residual input.

A producer is fused only when the fused layer is its single consumer and it is not a graph output.
Then dead layers (not reaching an output; inputs stay) are dropped and indices renumbered.
"""
from __future__ import annotations

import numpy as np

from .. import ir


def fuse_layers(layers: list[ir.Layer], inputs: dict[str, int], outputs: dict[str, int]):
    n = len(layers)
    alive = [True] * n
    redirect = list(range(n))
    consumers = [0] * n
    is_output = [False] * n
    for layer in layers:
        for p in set(layer.inputs):
            consumers[p] += 1
    for i in outputs.values():
        is_output[i] = True

    def resolve(i):
        while redirect[i] != i:
            i = redirect[i]
        return i

    def single(i):
        return consumers[i] == 1 and not is_output[i]

    def absorb(j, p):  # layer j disappears into its producer p
        alive[j] = False
        redirect[j] = p
        consumers[p] = consumers[j]
        is_output[p] = is_output[j]
        layers[p].onnx_shape = layers[j].onnx_shape
        layers[p].layout = layers[j].layout

    for j, layer in enumerate(layers):
        layer.inputs = [resolve(i) for i in layer.inputs]
        if layer.op == "AFFINE" and single(layer.inputs[0]):
            p = layer.inputs[0]
            if _fold_affine(layers[p], layer):
                absorb(j, p)
        elif layer.op == "BINARY" and len(layer.inputs) == 2 and \
                layer.attrs["kind"] == ir.BIN_ADD and layer.inputs[0] != layer.inputs[1]:
            a, b = layer.inputs
            for c, other in ((b, a), (a, b)):
                conv = layers[c]
                if conv.op == "CONV" and single(c) and len(conv.inputs) == 1 and \
                        conv.attrs["act"] == ir.ACT_NONE and conv.shape == layer.shape and \
                        layers[other].shape == layer.shape:
                    fused = ir.Layer(name=conv.name, op="CONV", inputs=[conv.inputs[0], other],
                                     shape=conv.shape, attrs=dict(conv.attrs),
                                     weights=conv.weights, onnx_shape=layer.onnx_shape,
                                     layout=layer.layout)
                    for key in ("act", "alpha", "beta"):
                        fused.attrs[key] = layer.attrs[key]
                    layers[j] = fused
                    alive[c] = False
                    break

    outputs = {name: resolve(i) for name, i in outputs.items()}
    return prune_layers(layers, inputs, outputs, alive)


def prune_layers(layers, inputs, outputs, alive=None):
    """Keeps the layers an output reaches (and every input), except those marked not ``alive``
    (fused away), renumbering them and the input / output maps."""
    n = len(layers)
    alive = [True] * n if alive is None else alive
    needed = [False] * n
    for i in list(outputs.values()) + list(inputs.values()):
        needed[i] = True
    for j in range(n - 1, -1, -1):
        if needed[j] and alive[j]:
            for p in layers[j].inputs:
                needed[p] = True
    keep = [j for j in range(n) if needed[j] and alive[j]]
    new_index = {old: k for k, old in enumerate(keep)}
    out_layers = []
    for old in keep:
        layer = layers[old]
        layer.inputs = [new_index[p] for p in layer.inputs]
        out_layers.append(layer)
    return (out_layers, {k: new_index[v] for k, v in inputs.items()},
            {k: new_index[v] for k, v in outputs.items()})


def _is_pure_activation(layer: ir.Layer) -> bool:
    return bool(np.all(layer.weights["scale"] == 1.0) and np.all(layer.weights["shift"] == 0.0))


def _set_act(producer: ir.Layer, affine: ir.Layer) -> None:
    for key in ("act", "alpha", "beta"):
        producer.attrs[key] = affine.attrs[key]


def _clip_range(attrs):
    if attrs["act"] == ir.ACT_RELU:
        return 0.0, np.inf
    if attrs["act"] == ir.ACT_CLIP:
        return attrs["alpha"], attrs["beta"]
    return None


def _fold_affine(producer: ir.Layer, affine: ir.Layer) -> bool:
    """Folds ``affine`` into ``producer`` when possible (returns whether it did)."""
    if producer.op == "LAYERNORM" and affine.attrs["act"] == ir.ACT_NONE:
        scale = affine.weights["scale"].astype(np.float64)
        producer.weights["scale"] = (producer.weights["scale"] * scale).astype(np.float32)
        shift = producer.weights["shift"] * scale + affine.weights["shift"]
        producer.weights["shift"] = shift.astype(np.float32)
        return True
    if producer.op not in ("CONV", "AFFINE", "BINARY"):
        return False
    pure = _is_pure_activation(affine)
    if producer.attrs["act"] != ir.ACT_NONE:
        # clip(clip(x, a, b), c, d) = clip(x, max(a, c), min(b, d)) when the ranges overlap
        r1, r2 = _clip_range(producer.attrs), _clip_range(affine.attrs)
        if not pure or r1 is None or r2 is None:
            return False
        lo, hi = max(r1[0], r2[0]), min(r1[1], r2[1])
        if lo > hi:
            return False
        producer.attrs.update(act=ir.ACT_RELU if (lo, hi) == (0.0, np.inf) else ir.ACT_CLIP,
                              alpha=float(lo), beta=float(hi))
        if producer.attrs["act"] == ir.ACT_RELU:
            producer.attrs.update(alpha=0.0, beta=0.0)
        return True
    scale = affine.weights["scale"].astype(np.float64)
    shift = affine.weights["shift"].astype(np.float64)
    if producer.op == "CONV":
        if not pure:
            if len(producer.inputs) > 1:  # the residual would be scaled too
                return False
            w = producer.weights["w"]
            g, _, _, _, cout_g = w.shape
            # float32 products of float32 values are correctly rounded: as exact as float64
            producer.weights["w"] = w * scale.astype(np.float32).reshape(g, 1, 1, 1, cout_g)
            producer.weights["b"] = (producer.weights["b"] * scale + shift).astype(np.float32)
    elif producer.op == "AFFINE":
        if not pure:
            producer.weights["scale"] = (producer.weights["scale"] * scale).astype(np.float32)
            shift = producer.weights["shift"] * scale + shift
            producer.weights["shift"] = shift.astype(np.float32)
    elif not pure:  # BINARY takes activations only
        return False
    _set_act(producer, affine)
    return True
