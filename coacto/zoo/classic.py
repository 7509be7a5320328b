"""Classic classifiers: torchvision's ResNet-18 / ResNet-50 (v1.5, and pre-activation ResNet v2
in ``"preact"`` style) and VGG-16 (configuration D)."""
from __future__ import annotations

from ._layers import _Graph, _classifier_tail


def _resnet_stem(g: _Graph, x: str, *, preact: bool) -> str:
    x = g.conv(x, "conv1", 64, 7, 2, 3)
    if not preact:
        x = g.bn(x, "bn1")
        x = g.relu(x, "relu")
    return g.maxpool(x, "maxpool", 3, 2, 1)


def _basic_block(g: _Graph, x: str, mod: str, cout: int, stride: int, preact: bool) -> str:
    cin = g.shape[x][1]
    down = stride != 1 or cin != cout
    if preact:
        a = g.relu(g.bn(x, f"{mod}.bn1"), f"{mod}.relu")
        shortcut = g.conv(a, f"{mod}.downsample.0", cout, 1, stride) if down else x
        y = g.conv(a, f"{mod}.conv1", cout, 3, stride, 1)
        y = g.relu(g.bn(y, f"{mod}.bn2"), f"{mod}.relu")
        y = g.conv(y, f"{mod}.conv2", cout, 3, 1, 1)
        return g.add(y, shortcut, mod)
    y = g.conv(x, f"{mod}.conv1", cout, 3, stride, 1)
    y = g.relu(g.bn(y, f"{mod}.bn1"), f"{mod}.relu")
    y = g.conv(y, f"{mod}.conv2", cout, 3, 1, 1)
    y = g.bn(y, f"{mod}.bn2")
    if down:
        shortcut = g.bn(g.conv(x, f"{mod}.downsample.0", cout, 1, stride), f"{mod}.downsample.1")
    else:
        shortcut = x
    return g.relu(g.add(y, shortcut, mod), f"{mod}.relu")


def _bottleneck(g: _Graph, x: str, mod: str, width: int, stride: int, preact: bool) -> str:
    cin = g.shape[x][1]
    cout = width * 4
    down = stride != 1 or cin != cout
    if preact:
        a = g.relu(g.bn(x, f"{mod}.bn1"), f"{mod}.relu")
        shortcut = g.conv(a, f"{mod}.downsample.0", cout, 1, stride) if down else x
        y = g.conv(a, f"{mod}.conv1", width, 1)
        y = g.relu(g.bn(y, f"{mod}.bn2"), f"{mod}.relu")
        y = g.conv(y, f"{mod}.conv2", width, 3, stride, 1)
        y = g.relu(g.bn(y, f"{mod}.bn3"), f"{mod}.relu")
        y = g.conv(y, f"{mod}.conv3", cout, 1)
        return g.add(y, shortcut, mod)
    y = g.relu(g.bn(g.conv(x, f"{mod}.conv1", width, 1), f"{mod}.bn1"), f"{mod}.relu")
    # torchvision v1.5: the stride sits on the 3x3
    y = g.relu(g.bn(g.conv(y, f"{mod}.conv2", width, 3, stride, 1), f"{mod}.bn2"), f"{mod}.relu")
    y = g.bn(g.conv(y, f"{mod}.conv3", cout, 1), f"{mod}.bn3")
    if down:
        shortcut = g.bn(g.conv(x, f"{mod}.downsample.0", cout, 1, stride), f"{mod}.downsample.1")
    else:
        shortcut = x
    return g.relu(g.add(y, shortcut, mod), f"{mod}.relu")


def _resnet(g: _Graph, x: str, *, bottleneck: bool, layers: list[int], softmax: bool,
            num_classes: int, dynamic_flatten: bool) -> str:
    preact = g.style == "preact"
    x = _resnet_stem(g, x, preact=preact)
    widths = [64, 128, 256, 512]
    for li, (width, nblocks) in enumerate(zip(widths, layers)):
        for b in range(nblocks):
            stride = 2 if (li > 0 and b == 0) else 1
            mod = f"layer{li + 1}.{b}"
            if bottleneck:
                x = _bottleneck(g, x, mod, width, stride, preact)
            else:
                x = _basic_block(g, x, mod, width, stride, preact)
    if preact:  # ResNet v2 ends with a final BN-ReLU
        x = g.relu(g.bn(x, "bn_final"), "relu_final")
    x = g.global_avgpool(x, "avgpool")
    if g.zoo:
        flatten = "reshape"
    else:
        flatten = "dynamic" if dynamic_flatten else "flatten"
    return _classifier_tail(g, x, "fc", num_classes, softmax=softmax, flatten=flatten)


def _vgg16(g: _Graph, x: str, *, softmax: bool, num_classes: int) -> str:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    i = 0
    for v in cfg:
        if v == "M":
            x = g.maxpool(x, f"features.{i}", 2, 2)
            i += 1
        else:
            x = g.conv(x, f"features.{i}", v, 3, 1, 1, bias=True)
            x = g.relu(x, f"features.{i + 1}")
            i += 2
    # torchvision's AdaptiveAvgPool2d((7, 7)) is the identity at 224; the flatten size follows the
    # image size here instead (512 * (S/32)^2).
    x = g.flatten_to_2d(x, "reshape" if g.zoo else "flatten")
    x = g.relu(g.gemm(x, "classifier.0", 4096), "classifier.1")
    x = g.dropout(x, "classifier.2")
    x = g.relu(g.gemm(x, "classifier.3", 4096), "classifier.4")
    x = g.dropout(x, "classifier.5")
    x = g.gemm(x, "classifier.6", num_classes)
    return g.softmax(x) if softmax else x
