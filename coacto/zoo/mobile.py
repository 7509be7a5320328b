"""Mobile architectures: torchvision's MobileNetV2 and SqueezeNet 1.1, and the ShuffleNetV2
(stem + stage 2) and MobileNetV3-Large (stem + units 1-7) blocks with their classifiers."""
from __future__ import annotations

import numpy as np

from ._layers import _Graph, _classifier_tail


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def _mobilenetv2(g: _Graph, x: str, *, softmax: bool, num_classes: int) -> str:
    x = g.relu6(g.bn(g.conv(x, "features.0.0", 32, 3, 2, 1), "features.0.1"), "features.0.2")
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]
    idx = 1
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            mod = f"features.{idx}.conv"
            cin = g.shape[x][1]
            hidden = cin * t
            y = x
            j = 0
            if t != 1:
                y = g.relu6(g.bn(g.conv(y, f"{mod}.0.0", hidden, 1), f"{mod}.0.1"), f"{mod}.0.2")
                j = 1
            y = g.conv(y, f"{mod}.{j}.0", hidden, 3, stride, 1, g=hidden)
            y = g.relu6(g.bn(y, f"{mod}.{j}.1"), f"{mod}.{j}.2")
            y = g.bn(g.conv(y, f"{mod}.{j + 1}", c, 1), f"{mod}.{j + 2}")
            if stride == 1 and cin == c:
                y = g.add(x, y, f"features.{idx}")
            x = y
            idx += 1
    x = g.relu6(g.bn(g.conv(x, f"features.{idx}.0", 1280, 1), f"features.{idx}.1"),
                f"features.{idx}.2")
    x = g.global_avgpool(x, "")
    return _classifier_tail(g, x, "classifier.1", num_classes, softmax=softmax,
                            flatten="reshape" if g.zoo else "flatten")


def _squeezenet(g: _Graph, x: str, *, softmax: bool, num_classes: int) -> str:
    x = g.relu(g.conv(x, "features.0", 64, 3, 2, 0, bias=True), "features.1")
    x = g.maxpool(x, "features.2", 3, 2, ceil=True)

    def fire(x: str, i: int, sq: int, e1: int, e3: int) -> str:
        m = f"features.{i}"
        s = g.relu(g.conv(x, f"{m}.squeeze", sq, 1, bias=True), f"{m}.squeeze_activation")
        a = g.relu(g.conv(s, f"{m}.expand1x1", e1, 1, bias=True), f"{m}.expand1x1_activation")
        b = g.relu(g.conv(s, f"{m}.expand3x3", e3, 3, 1, 1, bias=True,
                          explicit_pad=g.zoo), f"{m}.expand3x3_activation")
        return g.concat([a, b], m)

    x = fire(x, 3, 16, 64, 64)
    x = fire(x, 4, 16, 64, 64)
    x = g.maxpool(x, "features.5", 3, 2, ceil=True)
    x = fire(x, 6, 32, 128, 128)
    x = fire(x, 7, 32, 128, 128)
    x = g.maxpool(x, "features.8", 3, 2, ceil=True)
    x = fire(x, 9, 48, 192, 192)
    x = fire(x, 10, 48, 192, 192)
    x = fire(x, 11, 64, 256, 256)
    x = fire(x, 12, 64, 256, 256)
    x = g.dropout(x, "classifier.0")
    x = g.relu(g.conv(x, "classifier.1", num_classes, 1, bias=True, gain=2.0),
               "classifier.2")
    x = g.global_avgpool(x, "classifier.3")
    x = g.flatten_to_2d(x, "reshape" if g.zoo else "flatten")
    return g.softmax(x) if softmax else x


def _channel_shuffle(g: _Graph, x: str, m: str, groups: int = 2) -> str:
    n, c, h, w = g.shape[x]
    dyn = g.style != "zoo"
    mean, var = g.mom[x]
    x = g.reshape(x, m, [n, groups, c // groups, h, w], dynamic_batch=dyn)
    x = g.transpose(x, m, [0, 2, 1, 3, 4])
    y = g.reshape(x, m, [n, -1, h, w], dynamic_batch=dyn)
    perm = np.arange(c).reshape(groups, c // groups).T.reshape(-1)
    g.mom[y] = (mean[perm], var[perm])
    return y


def _shufflenet_unit(g: _Graph, x: str, *, softmax: bool = False, num_classes: int = 1000,
                     **_) -> str:
    """ShuffleNetV2 1.0x: stem, stage 2 (one stride-2 unit, three stride-1 units), conv5,
    mean over H, W (ReduceMean) and the classifier -- torchvision's layers."""
    x = g.relu(g.bn(g.conv(x, "conv1.0", 24, 3, 2, 1), "conv1.1"), "conv1.2")
    x = g.maxpool(x, "maxpool", 3, 2, 1)
    out = 116
    bf = out // 2
    for u in range(4):
        m = f"stage2.{u}"
        if u == 0:
            cin = g.shape[x][1]
            b1 = g.bn(g.conv(x, f"{m}.branch1.0", cin, 3, 2, 1, g=cin), f"{m}.branch1.1")
            b1 = g.relu(g.bn(g.conv(b1, f"{m}.branch1.2", bf, 1), f"{m}.branch1.3"),
                        f"{m}.branch1.4")
            src = x
        else:
            b1, src = g.split(x, m, [bf, bf])
        stride = 2 if u == 0 else 1
        y = g.relu(g.bn(g.conv(src, f"{m}.branch2.0", bf, 1), f"{m}.branch2.1"), f"{m}.branch2.2")
        y = g.bn(g.conv(y, f"{m}.branch2.3", bf, 3, stride, 1, g=bf), f"{m}.branch2.4")
        y = g.relu(g.bn(g.conv(y, f"{m}.branch2.5", bf, 1), f"{m}.branch2.6"), f"{m}.branch2.7")
        x = _channel_shuffle(g, g.concat([b1, y], m), m)
    x = g.relu(g.bn(g.conv(x, "conv5.0", 1024, 1), "conv5.1"), "conv5.2")
    x = g.reduce_mean(x, "", [2, 3], keepdims=0)  # x.mean([2, 3])
    y = g.gemm(x, "fc", num_classes)
    return g.softmax(y) if softmax else y


def _se(g: _Graph, x: str, m: str, squeeze: int, kind: str) -> str:
    """Squeeze-excite: pool -> Conv -> Relu -> Conv -> gate -> Mul (N,C,1,1) x (N,C,H,W).

    ``kind="hard"``: GlobalAveragePool + HardSigmoid (MobileNetV3); ``"sigmoid"``: ReduceMean
    (keepdims) + Sigmoid (EfficientNet)."""
    c = g.shape[x][1]
    if kind == "hard":
        s = g.global_avgpool(x, f"{m}.avgpool")
    else:
        s = g.reduce_mean(x, f"{m}", [2, 3], keepdims=1)
    s = g.relu(g.conv(s, f"{m}.fc1", squeeze, 1, bias=True), f"{m}.relu")
    s = g.conv(s, f"{m}.fc2", c, 1, bias=True)
    s = g.hardsigmoid(s, f"{m}.scale_activation") if kind == "hard" else \
        g.sigmoid(s, f"{m}.scale_activation")
    return g.mul(s, x, m)


def _mobilenetv3_block(g: _Graph, x: str, *, softmax: bool = False, num_classes: int = 1000,
                       **_) -> str:
    """MobileNetV3-Large stem and first inverted-residual units (torchvision configuration), with
    activation variants so that every activation the importer knows appears: ReLU, LeakyReLU,
    HardSwish, HardSigmoid / Sigmoid gates; then last conv, pooling and the classifier."""
    def act(y: str, kind: str, m: str) -> str:
        if kind == "RE":
            return g.relu(y, m)
        if kind == "LR":
            return g.leaky_relu(y, m, 0.1)
        if kind == "SW":
            return g.swish(y, m)
        return g.hardswish(y, m)

    x = act(g.bn(g.conv(x, "features.0.0", 16, 3, 2, 1), "features.0.1"), "HS", "features.0.2")
    # (kernel, expanded, out, se, activation, stride) -- MobileNetV3-Large units 1-7, with unit 3
    # using LeakyReLU and unit 5 an EfficientNet-style sigmoid SE and Swish activation
    conf = [(3, 16, 16, None, "RE", 1), (3, 64, 24, None, "RE", 2), (3, 72, 24, None, "LR", 1),
            (5, 72, 40, "hard", "RE", 2), (5, 120, 40, "sigmoid", "SW", 1),
            (5, 120, 40, "hard", "HS", 1), (3, 240, 80, None, "HS", 2)]
    for i, (k, exp, out, se, a, s) in enumerate(conf, start=1):
        m = f"features.{i}.block"
        cin = g.shape[x][1]
        y = x
        j = 0
        if exp != cin:
            y = act(g.bn(g.conv(y, f"{m}.0.0", exp, 1), f"{m}.0.1"), a, f"{m}.0.2")
            j = 1
        y = act(g.bn(g.conv(y, f"{m}.{j}.0", exp, k, s, (k - 1) // 2, g=exp), f"{m}.{j}.1"), a,
                f"{m}.{j}.2")
        j += 1
        if se:
            y = _se(g, y, f"{m}.{j}", _make_divisible(exp // 4, 8), se)
            j += 1
        y = g.bn(g.conv(y, f"{m}.{j}.0", out, 1), f"{m}.{j}.1")
        if s == 1 and cin == out:
            y = g.add(y, x, f"features.{i}")
        x = y
    last = 6 * g.shape[x][1]
    n = len(conf) + 1
    x = act(g.bn(g.conv(x, f"features.{n}.0", last, 1), f"features.{n}.1"), "HS", f"features.{n}.2")
    x = g.global_avgpool(x, "avgpool")
    x = g.flatten_to_2d(x, "flatten" if g.zoo else "squeeze")
    x = g.hardswish(g.gemm(x, "classifier.0", 1280), "classifier.1")
    x = g.dropout(x, "classifier.2", 0.2)
    y = g.gemm(x, "classifier.3", num_classes)
    return g.softmax(y) if softmax else y
