"""Multi-branch blocks: the DenseNet-121 dense block (stem, block 1, transition 1) and the
GoogLeNet stem with inception 3a / 3b."""
from __future__ import annotations

from ._layers import _Graph


def _densenet_block(g: _Graph, x: str, *, growth: int = 32, bn_size: int = 4, layers: int = 6,
                    **_) -> str:
    """DenseNet-121 stem, dense block 1 (6 layers) and transition 1, as torchvision writes it."""
    x = g.conv(x, "features.conv0", 64, 7, 2, 3)
    x = g.relu(g.bn(x, "features.norm0"), "features.relu0")
    x = g.maxpool(x, "features.pool0", 3, 2, 1)
    feats = [x]
    for i in range(1, layers + 1):
        m = f"features.denseblock1.denselayer{i}"
        cat = g.concat(feats, m)  # torch.cat(prev_features, 1), one input for the first layer
        # pre-activation BN: its input is a Concat (or a MaxPool), not a conv
        y = g.relu(g.bn(cat, f"{m}.norm1"), f"{m}.relu1")
        y = g.conv(y, f"{m}.conv1", bn_size * growth, 1)
        y = g.relu(g.bn(y, f"{m}.norm2"), f"{m}.relu2")
        y = g.conv(y, f"{m}.conv2", growth, 3, 1, 1)
        feats.append(y)
    x = g.concat(feats, "features.denseblock1")
    c = g.shape[x][1]
    x = g.relu(g.bn(x, "features.transition1.norm"), "features.transition1.relu")
    x = g.conv(x, "features.transition1.conv", c // 2, 1)
    return g.avgpool(x, "features.transition1.pool", 2, 2)


def _inception_module(g: _Graph, x: str, m: str, c1: int, c3r: int, c3: int, c5r: int, c5: int,
                      pp: int, pool: str) -> str:
    b1 = g.relu(g.conv(x, f"{m}.1x1", c1, 1, bias=True), f"{m}.relu_1x1")
    b2 = g.relu(g.conv(x, f"{m}.3x3_reduce", c3r, 1, bias=True), f"{m}.relu_3x3_reduce")
    b2 = g.relu(g.conv(b2, f"{m}.3x3", c3, 3, 1, 1, bias=True), f"{m}.relu_3x3")
    b3 = g.relu(g.conv(x, f"{m}.5x5_reduce", c5r, 1, bias=True), f"{m}.relu_5x5_reduce")
    b3 = g.relu(g.conv(b3, f"{m}.5x5", c5, 5, 1, 2, bias=True), f"{m}.relu_5x5")
    if pool == "max":
        b4 = g.maxpool(x, f"{m}.pool", 3, 1, 1)
    else:  # Inception-v3 style: F.avg_pool2d(x, 3, 1, 1), count_include_pad=True
        b4 = g.avgpool(x, f"{m}.pool", 3, 1, 1, count_include_pad=1)
    b4 = g.relu(g.conv(b4, f"{m}.pool_proj", pp, 1, bias=True), f"{m}.relu_pool_proj")
    return g.concat([b1, b2, b3, b4], f"{m}.output")


def _inception_block(g: _Graph, x: str, **_) -> str:
    """GoogLeNet (BVLC) stem with LRN, inception 3a (exact), inception 3b with an Inception-v3
    style average-pool branch (count_include_pad=1), then a TF-"SAME"-style average pool
    (count_include_pad=0)."""
    x = g.relu(g.conv(x, "conv1.7x7_s2", 64, 7, 2, 3, bias=True), "conv1.relu_7x7")
    x = g.maxpool(x, "pool1.3x3_s2", 3, 2, ceil=True)
    x = g.lrn(x, "pool1.norm1")
    x = g.relu(g.conv(x, "conv2.3x3_reduce", 64, 1, bias=True), "conv2.relu_3x3_reduce")
    x = g.relu(g.conv(x, "conv2.3x3", 192, 3, 1, 1, bias=True), "conv2.relu_3x3")
    x = g.lrn(x, "conv2.norm2")
    x = g.maxpool(x, "pool2.3x3_s2", 3, 2, ceil=True)
    x = _inception_module(g, x, "inception_3a", 64, 96, 128, 16, 32, 32, pool="max")
    x = _inception_module(g, x, "inception_3b", 128, 128, 192, 32, 96, 64, pool="avg")
    return g.avgpool(x, "pool3.3x3_s2", 3, 2, 1, count_include_pad=0)
