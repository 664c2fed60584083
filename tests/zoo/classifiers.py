"""ImageNet classifiers at 1x3x224x224 -> 1x1000, re-written in plain torch after torchvision.

Layer structure, channel counts, strides, activations and the order of ops follow torchvision's
definitions (resnet.py, mobilenetv2.py, mobilenetv3.py, shufflenetv2.py, squeezenet.py,
efficientnet.py); only the weight initialisation differs (seeded random, see tests.zoo).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import ModelSpec, builder, image_inputs


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNAct(nn.Sequential):
    """conv (no bias) + BatchNorm2d + optional activation, 'same' padding for odd kernels."""

    def __init__(self, cin, cout, k=3, stride=1, groups=1, act: type[nn.Module] | None = nn.ReLU):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(
                act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.SiLU, nn.Hardswish) else act()
            )
        super().__init__(*layers)


# ---------------------------------------------------------------------------------------------
# ResNet-18


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 2)
        self.layer2 = self._make_layer(128, 2, stride=2)
        self.layer3 = self._make_layer(256, 2, stride=2)
        self.layer4 = self._make_layer(512, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# ---------------------------------------------------------------------------------------------
# MobileNetV2


class InvertedResidualV2(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNAct(inp, hidden, 1, act=nn.ReLU6))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000, width_mult=1.0):
        super().__init__()
        input_channel = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        setting = [
            # t, c, n, s
            [1, 16, 1, 1],
            [6, 24, 2, 2],
            [6, 32, 3, 2],
            [6, 64, 4, 2],
            [6, 96, 3, 1],
            [6, 160, 3, 2],
            [6, 320, 1, 1],
        ]
        features: list[nn.Module] = [ConvBNAct(3, input_channel, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in setting:
            out = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidualV2(input_channel, out, s if i == 0 else 1, t))
                input_channel = out
        features.append(ConvBNAct(input_channel, self.last_channel, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(self.last_channel, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


# ---------------------------------------------------------------------------------------------
# MobileNetV3-Small


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation: avgpool -> 1x1 conv -> act -> 1x1 conv -> scale_act."""

    def __init__(self, cin, squeeze, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(cin, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, cin, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.avgpool(x)
        scale = self.fc2(self.activation(self.fc1(scale)))
        return self.scale_activation(scale) * x


class InvertedResidualV3(nn.Module):
    def __init__(self, cin, k, exp, cout, use_se, act, stride):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act_layer = nn.Hardswish if act == "HS" else nn.ReLU
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=act_layer))
        layers.append(ConvBNAct(exp, exp, k, stride, groups=exp, act=act_layer))
        if use_se:
            layers.append(
                SqueezeExcitation(
                    exp, _make_divisible(exp // 4, 8), scale_activation=nn.Hardsigmoid
                )
            )
        layers.append(ConvBNAct(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        # (input_channels, kernel, expanded_channels, out_channels, use_se, activation, stride)
        cfg = [
            (16, 3, 16, 16, True, "RE", 2),
            (16, 3, 72, 24, False, "RE", 2),
            (24, 3, 88, 24, False, "RE", 1),
            (24, 5, 96, 40, True, "HS", 2),
            (40, 5, 240, 40, True, "HS", 1),
            (40, 5, 240, 40, True, "HS", 1),
            (40, 5, 120, 48, True, "HS", 1),
            (48, 5, 144, 48, True, "HS", 1),
            (48, 5, 288, 96, True, "HS", 2),
            (96, 5, 576, 96, True, "HS", 1),
            (96, 5, 576, 96, True, "HS", 1),
        ]
        layers: list[nn.Module] = [ConvBNAct(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidualV3(*c) for c in cfg]
        layers.append(ConvBNAct(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(576, 1024),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=0.2, inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------------------------------------
# ShuffleNetV2 x1.0


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, -1, height, width)


class ShuffleInvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        branch_features = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch_features, 1, 1, 0, bias=False),
                nn.BatchNorm2d(branch_features),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(
                branch_features, branch_features, 3, stride, 1, groups=branch_features, bias=False
            ),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(
        self,
        stages_repeats=(4, 8, 4),
        stages_out_channels=(24, 116, 232, 464, 1024),
        num_classes=1000,
    ):
        super().__init__()
        input_channels = 3
        output_channels = stages_out_channels[0]
        self.conv1 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        input_channels = output_channels
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for name, repeats, output_channels in zip(
            ["stage2", "stage3", "stage4"], stages_repeats, stages_out_channels[1:]
        ):
            seq = [ShuffleInvertedResidual(input_channels, output_channels, 2)]
            seq += [
                ShuffleInvertedResidual(output_channels, output_channels, 1)
                for _ in range(repeats - 1)
            ]
            setattr(self, name, nn.Sequential(*seq))
            input_channels = output_channels
        output_channels = stages_out_channels[-1]
        self.conv5 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        self.fc = nn.Linear(output_channels, num_classes)

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        x = self.conv5(x)
        x = x.mean([2, 3])  # global pool
        return self.fc(x)


# ---------------------------------------------------------------------------------------------
# SqueezeNet 1.1


class Fire(nn.Module):
    def __init__(self, inplanes, squeeze_planes, expand1x1_planes, expand3x3_planes):
        super().__init__()
        self.squeeze = nn.Conv2d(inplanes, squeeze_planes, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze_planes, expand1x1_planes, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze_planes, expand3x3_planes, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat(
            [
                self.expand1x1_activation(self.expand1x1(x)),
                self.expand3x3_activation(self.expand3x3(x)),
            ],
            1,
        )


class SqueezeNet11(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=3, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(64, 16, 64, 64),
            Fire(128, 16, 64, 64),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(128, 32, 128, 128),
            Fire(256, 32, 128, 128),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(256, 48, 192, 192),
            Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256),
            Fire(512, 64, 256, 256),
        )
        final_conv = nn.Conv2d(512, num_classes, kernel_size=1)
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.5), final_conv, nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1))
        )
        # torchvision initialises with kaiming_uniform / normal(0, 0.01) for the final conv; the
        # latter gives near-constant logits, so keep the default init for a more useful test

    def forward(self, x):
        x = self.classifier(self.features(x))
        return torch.flatten(x, 1)


# ---------------------------------------------------------------------------------------------
# EfficientNet-B0


class MBConv(nn.Module):
    def __init__(self, expand_ratio, kernel, stride, cin, cout):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        expanded = _make_divisible(cin * expand_ratio, 8)
        if expanded != cin:
            layers.append(ConvBNAct(cin, expanded, 1, act=nn.SiLU))
        layers.append(ConvBNAct(expanded, expanded, kernel, stride, groups=expanded, act=nn.SiLU))
        squeeze = max(1, cin // 4)
        layers.append(SqueezeExcitation(expanded, squeeze, activation=nn.SiLU))
        layers.append(ConvBNAct(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        # StochasticDepth is the identity in eval mode

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = result + x
        return result


class EfficientNetB0(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        # expand_ratio, kernel, stride, input_channels, out_channels, num_layers
        cfg = [
            (1, 3, 1, 32, 16, 1),
            (6, 3, 2, 16, 24, 2),
            (6, 5, 2, 24, 40, 2),
            (6, 3, 2, 40, 80, 3),
            (6, 5, 1, 80, 112, 3),
            (6, 5, 2, 112, 192, 4),
            (6, 3, 1, 192, 320, 1),
        ]
        layers: list[nn.Module] = [ConvBNAct(3, 32, 3, 2, act=nn.SiLU)]
        for e, k, s, cin, cout, n in cfg:
            stage = [
                MBConv(e, k, s if i == 0 else 1, cin if i == 0 else cout, cout) for i in range(n)
            ]
            layers.append(nn.Sequential(*stage))
        layers.append(ConvBNAct(320, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.2, inplace=True), nn.Linear(1280, num_classes)
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


_img224 = image_inputs(3, 224, 224)

MODELS = {
    s.name: s
    for s in [
        ModelSpec(
            "resnet18", builder(ResNet18), _img224, description="ResNet-18 (torchvision layout)"
        ),
        ModelSpec(
            "mobilenet_v2", builder(MobileNetV2, calibrate=(3, 224, 224)), _img224, description="MobileNetV2 1.0, ReLU6"
        ),
        ModelSpec(
            "mobilenet_v3_small",
            builder(MobileNetV3Small, calibrate=(3, 224, 224)),
            _img224,
            description="MobileNetV3-Small: hardswish, hardsigmoid squeeze-excitation",
        ),
        ModelSpec(
            "shufflenet_v2_x1_0",
            builder(ShuffleNetV2, calibrate=(3, 224, 224)),
            _img224,
            description="ShuffleNetV2 x1.0: chunk, cat, channel shuffle via view/transpose/view",
        ),
        ModelSpec(
            "squeezenet1_1",
            builder(SqueezeNet11, kaiming=True),
            _img224,
            description="SqueezeNet 1.1: Fire modules, ceil_mode max pooling, conv classifier",
        ),
        ModelSpec(
            "efficientnet_b0",
            builder(EfficientNetB0, calibrate=(3, 224, 224)),
            _img224,
            description="EfficientNet-B0: SiLU, depthwise, squeeze-excitation with sigmoid",
        ),
    ]
}
