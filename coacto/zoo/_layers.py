"""The zoo's layers: weight initialisation and per-channel moment propagation.

:class:`_Graph` adds to :class:`coacto.zoo._graph._GraphCore` the layers that create weights or
change activation statistics -- Conv, BatchNormalization, the activations, Add / Mul, pooling,
LRN, Dropout, Gemm, Softmax -- each in the form its opset and style call for, with the moments of
its output predicted from the actual weights (see :mod:`coacto.zoo`).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ._graph import _GraphCore, _torch_scope

_EPS = 1e-5


def _q_pos(a):
    """Round positive values to a 2^(1/16) grid (keeps BLAS rounding out of the model bytes)."""
    a = np.asarray(a, dtype=np.float64)
    return np.exp2(np.round(np.log2(np.maximum(a, 1e-30)) * 16.0) / 16.0)


def _q_abs(a):
    return np.round(np.asarray(a, dtype=np.float64) * 256.0) / 256.0


# ------------------------------------------------------------ moment propagation (per channel)
# Every activation tensor carries, per channel, the mean and variance its values have for
# N(0, 1) inputs, propagated through each layer with the actual weights (exact for the means of
# linear layers, independence assumptions for the variances). Batch normalisation statistics and
# weight scales are set from them, so activations stay of order one without running anything.
_GH_Z, _GH_W = np.polynomial.hermite_e.hermegauss(64)
_GH_W = _GH_W / _GH_W.sum()

_ACTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda a: np.maximum(a, 0.0),
    "relu6": lambda a: np.clip(a, 0.0, 6.0),
    "leakyrelu": lambda a: np.where(a > 0, a, 0.1 * a),
    "hardsigmoid": lambda a: np.clip(a / 6.0 + 0.5, 0.0, 1.0),
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
    "hardswish": lambda a: a * np.clip(a / 6.0 + 0.5, 0.0, 1.0),
    "swish": lambda a: a / (1.0 + np.exp(-a)),
}
_MONOTONE = {"relu", "relu6", "leakyrelu", "hardsigmoid", "sigmoid"}


def _gauss_moments(f, mean, var):
    """Mean and variance of f(y), y ~ N(mean, var) per channel (Gauss-Hermite quadrature)."""
    y = f(mean[:, None] + np.sqrt(np.maximum(var, 0.0))[:, None] * _GH_Z[None, :])
    m = y @ _GH_W
    return m, np.maximum((y * y) @ _GH_W - m * m, 1e-12)


def _max_of_normals(n: int) -> tuple[float, float]:
    """Mean and variance of the maximum of n iid N(0, 1)."""
    z = np.linspace(-12.0, 12.0, 24001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = n * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1)
    dz = z[1] - z[0]
    m = float((z * pdf).sum() * dz)
    return m, float((z * z * pdf).sum() * dz - m * m)


_MAX_TABLE: dict[int, tuple[float, float]] = {}


def _valid_fraction(size: int, out: int, k: int, s: int, p: int, d: int = 1) -> np.ndarray:
    """Per kernel tap, the fraction of output positions whose input position is not padding."""
    i = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return ((i >= 0) & (i < size)).mean(axis=0)


def _valid_patterns(size: int, out: int, k: int, s: int, p: int, d: int = 1):
    """The distinct masks of valid kernel taps along one axis, with their share of positions."""
    i = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    masks, counts = np.unique((i >= 0) & (i < size), axis=0, return_counts=True)
    return masks.astype(np.float64), counts / out


def _uniform(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """Uniform weights of standard deviation ``std`` (fast: 16-bit draws)."""
    w = rng.integers(0, 65536, size=shape, dtype=np.uint16).astype(np.float32)
    w -= np.float32(32767.5)
    w *= np.float32(math.sqrt(3.0) * std / 32767.5)
    return w


class _Graph(_GraphCore):
    """The graph builder the architectures use: :class:`_GraphCore` plus the layers."""

    def _check_size(self, module: str, ho: int, wo: int) -> None:
        if ho < 1 or wo < 1:
            raise ValueError(f"image size too small for {self.name}: layer {module!r} would have "
                             f"an empty ({ho}x{wo}) output")

    def _scale(self, mean: np.ndarray, var: np.ndarray, gain: float) -> float:
        """Factor that brings the predicted second moment of a layer's output to ``gain``."""
        m2 = float(np.mean(mean * mean + var))
        return float(_q_pos(math.sqrt(gain / m2))) if m2 > 0 else 1.0

    # ------------------------------------------------------------------------------ layers
    def conv(self, x: str, module: str, cout: int, k: int | tuple[int, int], s: int = 1, p: int = 0,
             g: int = 1, bias: bool = False, dilation: int = 1, explicit_pad: bool | None = None,
             gain: float = 1.0) -> str:
        """Conv (Kaiming-uniform weights, rescaled so the output's second moment is ``gain``)."""
        n, cin, h, w = self.shape[x]
        kh, kw = (k, k) if isinstance(k, int) else k
        cg, og = cin // g, cout // g
        ho = (h + 2 * p - dilation * (kh - 1) - 1) // s + 1
        wo = (w + 2 * p - dilation * (kw - 1) - 1) // s + 1
        self._check_size(module, ho, wo)
        wt = _uniform(self.rng, (cout, cg, kh, kw), math.sqrt(2.0 / (cg * kh * kw)))
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32) if bias else None
        # moments: exact per-channel means (with the padding's share of each tap), variances
        # assuming independent inputs
        frac = np.outer(_valid_fraction(h, ho, kh, s, p, dilation),
                        _valid_fraction(w, wo, kw, s, p, dilation)).astype(np.float32)
        w2f = (wt * wt * frac).sum(axis=(2, 3), dtype=np.float64)     # (cout, cg)
        mi, vi = self.mom[x]
        mi, vi = mi.reshape(g, cg), vi.reshape(g, cg)
        var = np.einsum("goc,gc->go", w2f.reshape(g, og, cg), vi).reshape(cout)
        # per output channel and tap, the input means times the weights; positions near the
        # border miss some taps, so the mean varies over positions: that adds to the variance
        tap = np.einsum("gockl,gc->gokl", wt.reshape(g, og, cg, kh, kw).astype(np.float64),
                        mi).reshape(cout, kh, kw)
        rows, rw = _valid_patterns(h, ho, kh, s, p, dilation)
        cols, cw = _valid_patterns(w, wo, kw, s, p, dilation)
        pm = np.einsum("okl,ak,bl->oab", tap, rows, cols)                # (cout, rows, cols)
        share = np.outer(rw, cw)
        mean = np.einsum("oab,ab->o", pm, share)
        var = var + np.einsum("oab,ab->o", (pm - mean[:, None, None]) ** 2, share)
        scale = self._scale(mean, var, gain)
        wt *= np.float32(scale)
        mean, var = mean * scale, var * scale * scale
        inputs = [x, self.init(f"{module}.weight", wt)]
        if bias:
            inputs.append(self.init(f"{module}.bias", b))
            mean = mean + b
        scope = _torch_scope(module)
        pads = [p, p, p, p]
        if explicit_pad is None:
            explicit_pad = self.zoo and s > 1 and p > 0
        if explicit_pad and p > 0:
            inputs[0] = self.pad(x, scope, [0, 0, p, p, 0, 0, p, p])
            pads = [0, 0, 0, 0]
        (y,) = self.node("Conv", inputs, scope, kernel_shape=[kh, kw], strides=[s, s], pads=pads,
                         dilations=[dilation] * 2, group=g)
        return self._set(y, (n, cout, ho, wo), mean, var)

    def bn(self, x: str, module: str) -> str:
        c = self.shape[x][1]
        rng = self.rng
        gamma = (1.0 + 0.1 * rng.standard_normal(c)).astype(np.float32)
        beta = (0.05 * rng.standard_normal(c)).astype(np.float32)
        noise_m = rng.standard_normal(c)
        noise_v = rng.uniform(0.8, 1.2, c)
        # running statistics as after training: the input's own per-channel moments, plus noise
        mi, vi = self.mom[x]
        mean = _q_abs(mi + 0.1 * np.sqrt(vi) * noise_m).astype(np.float32)
        var = _q_pos(vi * noise_v).astype(np.float32)
        scope = _torch_scope(module)
        scale = (gamma / np.sqrt(var + np.float32(_EPS))).astype(np.float32)
        shift = (beta - mean * scale).astype(np.float32)
        out_mean = mi * scale + shift
        out_var = vi * scale.astype(np.float64) ** 2
        if not self.zoo:
            ins = [x, self.init(f"{module}.weight", gamma), self.init(f"{module}.bias", beta),
                   self.init(f"{module}.running_mean", mean),
                   self.init(f"{module}.running_var", var)]
            (y,) = self.node("BatchNormalization", ins, scope, epsilon=_EPS, momentum=0.9)
        else:
            s_u = self.unsqueeze(self.init(f"{module}.scale", scale), scope, [1, 2])
            b_u = self.unsqueeze(self.init(f"{module}.shift", shift), scope, [1, 2])
            (t,) = self.node("Mul", [x, s_u], scope)
            self._set(t, self.shape[x], mi * scale, out_var)
            (y,) = self.node("Add", [t, b_u], scope)
        return self._set(y, self.shape[x], out_mean, out_var)

    # activations -----------------------------------------------------------------------------
    def _act(self, y: str, x: str, kind: str) -> str:
        mi, vi = self.mom[x]
        mean, var = _gauss_moments(_ACTS[kind], mi, vi)
        pre = (mi, vi, kind) if kind in _MONOTONE else None
        return self._set(y, self.shape[x], mean, var, pre)

    def relu(self, x: str, module: str) -> str:
        (y,) = self.node("Relu", [x], _torch_scope(module))
        return self._act(y, x, "relu")

    def relu6(self, x: str, module: str) -> str:
        scope = _torch_scope(module)
        if self.opset < 11:
            (y,) = self.node("Clip", [x], scope, min=0.0, max=6.0)
        else:
            lo, hi = self.scalar("relu6.min", 0.0), self.scalar("relu6.max", 6.0)
            (y,) = self.node("Clip", [x, lo, hi], scope)
        return self._act(y, x, "relu6")

    def leaky_relu(self, x: str, module: str, alpha: float = 0.1) -> str:
        assert alpha == 0.1
        (y,) = self.node("LeakyRelu", [x], _torch_scope(module), alpha=alpha)
        return self._act(y, x, "leakyrelu")

    def hardsigmoid(self, x: str, module: str) -> str:
        (y,) = self.node("HardSigmoid", [x], _torch_scope(module), alpha=1.0 / 6.0, beta=0.5)
        return self._act(y, x, "hardsigmoid")

    def sigmoid(self, x: str, module: str) -> str:
        (y,) = self.node("Sigmoid", [x], _torch_scope(module))
        return self._act(y, x, "sigmoid")

    def hardswish(self, x: str, module: str) -> str:
        scope = _torch_scope(module)
        if self.opset >= 14:
            (y,) = self.node("HardSwish", [x], scope)
        else:  # what torch exports below opset 14
            t = self.hardsigmoid(x, module)
            (y,) = self.node("Mul", [x, t], scope)
        return self._act(y, x, "hardswish")

    def swish(self, x: str, module: str) -> str:
        t = self.sigmoid(x, module)
        (y,) = self.node("Mul", [x, t], _torch_scope(module))
        return self._act(y, x, "swish")

    # element-wise -------------------------------------------------------------------------------
    def add(self, a: str, b: str, module: str) -> str:
        op = "Sum" if self.zoo else "Add"
        (y,) = self.node(op, [a, b], _torch_scope(module))
        shape = np.broadcast_shapes(self.shape[a], self.shape[b])
        (ma, va), (mb, vb) = self.mom[a], self.mom[b]
        return self._set(y, shape, ma + mb, va + vb)

    def mul(self, a: str, b: str, module: str) -> str:
        """Product of independent tensors (e.g. a squeeze-excite gate and the features)."""
        (y,) = self.node("Mul", [a, b], _torch_scope(module))
        shape = np.broadcast_shapes(self.shape[a], self.shape[b])
        (ma, va), (mb, vb) = self.mom[a], self.mom[b]
        mean = ma * mb
        return self._set(y, shape, mean, np.maximum((ma * ma + va) * (mb * mb + vb) - mean * mean,
                                                    1e-12))

    # pooling ------------------------------------------------------------------------------------
    @staticmethod
    def _pool_out(h, k, s, p, ceil):
        num = h + 2 * p - k
        o = (-(-num // s) if ceil else num // s) + 1
        if ceil and (o - 1) * s >= h + p:  # the last window must start inside input / left pad
            o -= 1
        return o

    def maxpool(self, x: str, module: str, k: int, s: int, p: int = 0, ceil: bool = False) -> str:
        n, c, h, w = self.shape[x]
        ho, wo = self._pool_out(h, k, s, p, ceil), self._pool_out(w, k, s, p, ceil)
        self._check_size(module, ho, wo)
        attrs = dict(kernel_shape=[k, k], strides=[s, s])
        if ceil and self.opset < 10:  # no ceil_mode yet: the same windows via explicit end pads
            eh = max(0, (ho - 1) * s + k - h - 2 * p)
            ew = max(0, (wo - 1) * s + k - w - 2 * p)
            attrs["pads"] = [p, p, p + eh, p + ew]
        else:
            attrs["pads"] = [p, p, p, p]
            if ceil:
                attrs["ceil_mode"] = 1
        (y,) = self.node("MaxPool", [x], _torch_scope(module), **attrs)
        # max of a window of (spatially correlated: counted as half as many) independent values;
        # max(f(y_i)) = f(max(y_i)) for a monotone activation f of Gaussian y
        n_eff = k * k if k <= 2 else (2 * k * k) // 3
        if n_eff not in _MAX_TABLE:
            _MAX_TABLE[n_eff] = _max_of_normals(n_eff)
        em, ev = _MAX_TABLE[n_eff]
        pre = self.pre[x]
        if pre is not None:
            pm, pv, kind = pre
            pm2, pv2 = pm + np.sqrt(pv) * em, pv * ev
            mean, var = _gauss_moments(_ACTS[kind], pm2, pv2)
            return self._set(y, (n, c, ho, wo), mean, var, (pm2, pv2, kind))
        mi, vi = self.mom[x]
        return self._set(y, (n, c, ho, wo), mi + np.sqrt(vi) * em, vi * ev)

    def avgpool(self, x: str, module: str, k: int, s: int, p: int = 0,
                count_include_pad: int = 1) -> str:
        n, c, h, w = self.shape[x]
        ho, wo = self._pool_out(h, k, s, p, False), self._pool_out(w, k, s, p, False)
        self._check_size(module, ho, wo)
        (y,) = self.node("AveragePool", [x], _torch_scope(module), kernel_shape=[k, k],
                         strides=[s, s], pads=[p, p, p, p], count_include_pad=count_include_pad)
        mi, vi = self.mom[x]
        frac = float(_valid_fraction(h, ho, k, s, p).mean() * _valid_fraction(w, wo, k, s, p).mean())
        mf = frac if count_include_pad else 1.0
        # neighbouring values are correlated: the variance drops by less than 1/k^2
        return self._set(y, (n, c, ho, wo), mi * mf, vi * mf * mf * 2.0 / (k * k + 1))

    def _spatial_mean(self, x: str, keep_var: float = 0.25):
        mi, vi = self.mom[x]
        return mi, vi * keep_var  # correlated positions: the mean keeps part of the variance

    def global_avgpool(self, x: str, module: str) -> str:
        n, c, _, _ = self.shape[x]
        (y,) = self.node("GlobalAveragePool", [x], _torch_scope(module))
        return self._set(y, (n, c, 1, 1), *self._spatial_mean(x))

    def reduce_mean(self, x: str, module: str, axes: list[int], keepdims: int) -> str:
        assert sorted(axes) == [2, 3]
        scope = _torch_scope(module)
        if self.opset < 18:
            (y,) = self.node("ReduceMean", [x], scope, axes=axes, keepdims=keepdims)
        else:
            (y,) = self.node("ReduceMean", [x, self.constant(scope, axes)], scope,
                             keepdims=keepdims)
        if keepdims:
            shape = [1 if i in axes else d for i, d in enumerate(self.shape[x])]
        else:
            shape = [d for i, d in enumerate(self.shape[x]) if i not in axes]
        return self._set(y, shape, *self._spatial_mean(x))

    def lrn(self, x: str, module: str, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
            bias: float = 1.0) -> str:
        (y,) = self.node("LRN", [x], _torch_scope(module), size=size, alpha=alpha, beta=beta,
                         bias=bias)
        mi, vi = self.mom[x]
        f = (bias + alpha * float(np.mean(mi * mi + vi))) ** -beta
        return self._set(y, self.shape[x], mi * f, vi * f * f)

    def dropout(self, x: str, module: str, ratio: float = 0.5) -> str:
        scope = _torch_scope(module)
        if self.opset < 12:
            (y,) = self.node("Dropout", [x], scope, ratio=ratio)
        else:
            (y,) = self.node("Dropout", [x, self.scalar(f"{module}.ratio", ratio)], scope)
        return self._set(y, self.shape[x], *self.mom[x], self.pre[x])

    def gemm(self, x: str, module: str, cout: int, gain: float = 1.0) -> str:
        """Gemm with transB=1 (PyTorch's Linear); output second moment ``gain``."""
        n, cin = self.shape[x]
        std = math.sqrt(2.0 / cin)
        wt = _uniform(self.rng, (cout, cin), std)
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32)
        mi, vi = self.mom[x]
        mean = (wt @ mi.astype(np.float32)).astype(np.float64)
        var = np.full(cout, std * std * float(vi.sum()))
        scale = self._scale(mean, var, gain)
        wt *= np.float32(scale)
        w = self.init(f"{module}.weight", wt)
        bn = self.init(f"{module}.bias", b)
        (y,) = self.node("Gemm", [x, w, bn], _torch_scope(module), alpha=1.0, beta=1.0, transB=1)
        return self._set(y, (n, cout), mean * scale + b, var * scale * scale)

    def softmax(self, x: str) -> str:
        (y,) = self.node("Softmax", [x], "", axis=1)
        c = self.shape[x][1]
        return self._set(y, self.shape[x], np.full(c, 1.0 / c), np.full(c, 1.0 / c ** 2))


# ==================================================================== shared by the architectures
def _classifier_tail(g: _Graph, x: str, module: str, num_classes: int, *, softmax: bool,
                     flatten: str = "flatten") -> str:
    """(N, C, 1, 1) pooled features -> (N, C) -> Gemm [-> Softmax]."""
    x = g.flatten_to_2d(x, flatten)
    y = g.gemm(x, module, num_classes)
    if softmax:
        y = g.softmax(y)
    return y
