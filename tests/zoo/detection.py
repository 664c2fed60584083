"""Dense-prediction models: a YOLOv5n-style and a YOLOv8n-style detector at 1x3x640x640 and a
UNet at 1x3x256x256.

YOLOv5n follows ultralytics/yolov5 v6+ (yolov5n.yaml: depth 0.33, width 0.25; 6x6/2 stem conv
instead of Focus, C3, SPPF, nearest upsample, Detect with sigmoid box decoding). YOLOv8n follows
ultralytics yolov8n.yaml (C2f with chunk, SPPF, anchor-free decoupled Detect head with DFL).
Grids, anchor grids, anchor points and strides are registered buffers, so pnnx exports them as
pnnx.Attribute; they are fixed for a 640x640 input (only the batch may vary).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import ModelSpec, builder, image_inputs


def autopad(k, p=None):
    return k // 2 if p is None else p


class Conv(nn.Module):
    """ultralytics Conv: Conv2d (no bias) + BatchNorm2d + SiLU."""

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut=True, g=1, k=(1, 3), e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C3(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=True, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C2f(nn.Module):
    """CSP bottleneck with 2 convolutions; the cv1 output is chunked in two (one op, two outputs)."""

    def __init__(self, c1, c2, n=1, shortcut=False, e=0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(
            Bottleneck(self.c, self.c, shortcut, k=(3, 3), e=1.0) for _ in range(n)
        )

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


# ---------------------------------------------------------------------------------------------
# YOLOv5n


class DetectV5(nn.Module):
    """YOLOv5 Detect: per level 1x1 conv, view/permute to (bs, na, ny, nx, no), sigmoid, split,
    xy = (2*xy + grid) * stride, wh = (2*wh)^2 * anchor_grid, cat, view to (bs, na*ny*nx, no)."""

    def __init__(self, nc=80, anchors=(), ch=(), strides=(8, 16, 32), img_size=640):
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.m = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch)
        self.strides = tuple(float(s) for s in strides)
        a = torch.tensor(anchors, dtype=torch.float32).view(self.nl, -1, 2)
        for i, s in enumerate(strides):
            ny = nx = img_size // s
            yv, xv = torch.meshgrid(
                torch.arange(ny, dtype=torch.float32),
                torch.arange(nx, dtype=torch.float32),
                indexing="ij",
            )
            grid = torch.stack((xv, yv), 2).expand(1, self.na, ny, nx, 2) - 0.5
            anchor_grid = a[i].view(1, self.na, 1, 1, 2).expand(1, self.na, ny, nx, 2)
            self.register_buffer(f"grid{i}", grid.contiguous().clone())
            self.register_buffer(f"anchor_grid{i}", anchor_grid.contiguous().clone())

    def forward(self, xs):
        z = []
        raw = []
        for i in range(self.nl):
            x = self.m[i](xs[i])
            bs, _, ny, nx = x.shape
            x = x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            raw.append(x)
            xy, wh, conf = x.sigmoid().split((2, 2, self.nc + 1), 4)
            xy = (xy * 2 + getattr(self, f"grid{i}")) * self.strides[i]
            wh = (wh * 2) ** 2 * getattr(self, f"anchor_grid{i}")
            y = torch.cat((xy, wh, conf), 4)
            z.append(y.view(bs, self.na * nx * ny, self.no))
        return (torch.cat(z, 1), *raw)


class YOLOv5n(nn.Module):
    ANCHORS = ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326))

    def __init__(self, nc=80):
        super().__init__()
        # backbone (yolov5n: width 0.25 -> 16/32/64/128/256 channels, depth 0.33 -> n=1,2,3,1)
        self.b0 = Conv(3, 16, 6, 2, 2)  # P1/2
        self.b1 = Conv(16, 32, 3, 2)  # P2/4
        self.b2 = C3(32, 32, 1)
        self.b3 = Conv(32, 64, 3, 2)  # P3/8
        self.b4 = C3(64, 64, 2)
        self.b5 = Conv(64, 128, 3, 2)  # P4/16
        self.b6 = C3(128, 128, 3)
        self.b7 = Conv(128, 256, 3, 2)  # P5/32
        self.b8 = C3(256, 256, 1)
        self.b9 = SPPF(256, 256, 5)
        # head
        self.h10 = Conv(256, 128, 1, 1)
        self.h11 = nn.Upsample(None, 2, "nearest")
        self.h13 = C3(256, 128, 1, False)
        self.h14 = Conv(128, 64, 1, 1)
        self.h15 = nn.Upsample(None, 2, "nearest")
        self.h17 = C3(128, 64, 1, False)  # P3/8-small
        self.h18 = Conv(64, 64, 3, 2)
        self.h20 = C3(128, 128, 1, False)  # P4/16-medium
        self.h21 = Conv(128, 128, 3, 2)
        self.h23 = C3(256, 256, 1, False)  # P5/32-large
        self.detect = DetectV5(nc, self.ANCHORS, (64, 128, 256))

    def forward(self, x):
        x = self.b2(self.b1(self.b0(x)))
        p3 = self.b4(self.b3(x))
        p4 = self.b6(self.b5(p3))
        x = self.b9(self.b8(self.b7(p4)))
        h10 = self.h10(x)
        x = self.h13(torch.cat((self.h11(h10), p4), 1))
        h14 = self.h14(x)
        out_s = self.h17(torch.cat((self.h15(h14), p3), 1))
        out_m = self.h20(torch.cat((self.h18(out_s), h14), 1))
        out_l = self.h23(torch.cat((self.h21(out_m), h10), 1))
        return self.detect([out_s, out_m, out_l])


# ---------------------------------------------------------------------------------------------
# YOLOv8n


class DFL(nn.Module):
    """Distribution focal loss integral: softmax over reg_max bins, then a fixed 1x1 conv with
    weights 0..reg_max-1 (the expectation)."""

    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float32).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class DetectV8(nn.Module):
    def __init__(self, nc=80, ch=(), strides=(8, 16, 32), img_size=640):
        super().__init__()
        self.nc = nc
        self.nl = len(ch)
        self.reg_max = 16
        self.no = nc + self.reg_max * 4
        c2, c3 = max((16, ch[0] // 4, self.reg_max * 4)), max(ch[0], min(self.nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * self.reg_max, 1))
            for x in ch
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, self.nc, 1)) for x in ch
        )
        self.dfl = DFL(self.reg_max)
        anchor_points, stride_tensor = [], []
        for s in strides:
            h = w = img_size // s
            sx = torch.arange(w, dtype=torch.float32) + 0.5
            sy = torch.arange(h, dtype=torch.float32) + 0.5
            sy, sx = torch.meshgrid(sy, sx, indexing="ij")
            anchor_points.append(torch.stack((sx, sy), -1).view(-1, 2))
            stride_tensor.append(torch.full((h * w, 1), float(s)))
        self.register_buffer(
            "anchors", torch.cat(anchor_points).transpose(0, 1).unsqueeze(0).contiguous()
        )
        self.register_buffer(
            "strides", torch.cat(stride_tensor).transpose(0, 1).unsqueeze(0).contiguous()
        )

    def forward(self, x):
        x = [torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1) for i in range(self.nl)]
        b = x[0].shape[0]
        x_cat = torch.cat([xi.view(b, self.no, -1) for xi in x], 2)
        box, cls = x_cat.split((self.reg_max * 4, self.nc), 1)
        # dist2bbox(xywh=True)
        lt, rb = self.dfl(box).chunk(2, 1)
        x1y1 = self.anchors - lt
        x2y2 = self.anchors + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
        y = torch.cat((dbox, cls.sigmoid()), 1)
        return (y, *x)


class YOLOv8n(nn.Module):
    def __init__(self, nc=80):
        super().__init__()
        self.b0 = Conv(3, 16, 3, 2)  # P1/2
        self.b1 = Conv(16, 32, 3, 2)  # P2/4
        self.b2 = C2f(32, 32, 1, True)
        self.b3 = Conv(32, 64, 3, 2)  # P3/8
        self.b4 = C2f(64, 64, 2, True)
        self.b5 = Conv(64, 128, 3, 2)  # P4/16
        self.b6 = C2f(128, 128, 2, True)
        self.b7 = Conv(128, 256, 3, 2)  # P5/32
        self.b8 = C2f(256, 256, 1, True)
        self.b9 = SPPF(256, 256, 5)
        self.up = nn.Upsample(None, 2, "nearest")
        self.h12 = C2f(384, 128, 1)
        self.h15 = C2f(192, 64, 1)  # P3/8-small
        self.h16 = Conv(64, 64, 3, 2)
        self.h18 = C2f(192, 128, 1)  # P4/16-medium
        self.h19 = Conv(128, 128, 3, 2)
        self.h21 = C2f(384, 256, 1)  # P5/32-large
        self.detect = DetectV8(nc, (64, 128, 256))

    def forward(self, x):
        x = self.b2(self.b1(self.b0(x)))
        p3 = self.b4(self.b3(x))
        p4 = self.b6(self.b5(p3))
        p5 = self.b9(self.b8(self.b7(p4)))
        h12 = self.h12(torch.cat((self.up(p5), p4), 1))
        out_s = self.h15(torch.cat((self.up(h12), p3), 1))
        out_m = self.h18(torch.cat((self.h16(out_s), h12), 1))
        out_l = self.h21(torch.cat((self.h19(out_m), p5), 1))
        return self.detect([out_s, out_m, out_l])


# ---------------------------------------------------------------------------------------------
# UNet (milesial/Pytorch-UNet layout, base width 16)


class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout, mid=None):
        mid = mid or cout
        super().__init__(
            nn.Conv2d(cin, mid, 3, padding=1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class Down(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.MaxPool2d(2), DoubleConv(cin, cout))


class Up(nn.Module):
    """Upscale x1 (ConvTranspose2d, or F.interpolate bilinear with the given align_corners), then
    cat with the skip x2 and DoubleConv. Sizes divide evenly at 256x256, so the F.pad of the
    original (no-op there) is left out."""

    def __init__(self, cin, cout, mode: str):
        super().__init__()
        self.mode = mode
        if mode == "transpose":
            self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(cin, cout)
        else:
            self.up = None
            # x1 keeps cin channels, the skip x2 has cin // 2
            self.conv = DoubleConv(cin + cin // 2, cout, cin // 2)

    def forward(self, x1, x2):
        if self.mode == "transpose":
            x1 = self.up(x1)
        else:
            x1 = F.interpolate(
                x1, scale_factor=2.0, mode="bilinear", align_corners=self.mode == "bilinear_ac"
            )
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels=3, n_classes=2, base=16):
        super().__init__()
        c = [base * 2**i for i in range(5)]  # 16 32 64 128 256
        self.inc = DoubleConv(n_channels, c[0])
        self.down1 = Down(c[0], c[1])
        self.down2 = Down(c[1], c[2])
        self.down3 = Down(c[2], c[3])
        self.down4 = Down(c[3], c[4])
        self.up1 = Up(c[4], c[3], "transpose")  # 256 -> 128 via ConvTranspose2d
        self.up2 = Up(c[3], c[2], "bilinear_ac")  # F.interpolate bilinear, align_corners=True
        self.up3 = Up(c[2], c[1], "transpose")
        self.up4 = Up(c[1], c[0], "bilinear")  # F.interpolate bilinear, align_corners=False
        self.outc = nn.Conv2d(c[0], n_classes, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x5 = self.down4(x4)
        x = self.up1(x5, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)


_img640 = image_inputs(3, 640, 640)

MODELS = {
    s.name: s
    for s in [
        ModelSpec(
            "yolov5n",
            builder(YOLOv5n, calibrate=(3, 640, 640)),
            _img640,
            dynamic_batch=2,
            description="YOLOv5n (v6 layout): 6x6/2 stem, C3, SPPF, nearest upsample, Detect decoding with grid/anchor_grid buffers",
            slow=True,
            outputs=("pred", "p3", "p4", "p5"),
        ),
        ModelSpec(
            "yolov8n",
            builder(YOLOv8n, calibrate=(3, 640, 640)),
            _img640,
            dynamic_batch=2,
            description="YOLOv8n: C2f (chunk), SPPF, anchor-free decoupled head, DFL softmax, split",
            slow=True,
            outputs=("pred", "p3", "p4", "p5"),
        ),
        ModelSpec(
            "unet",
            builder(UNet),
            image_inputs(3, 256, 256),
            dynamic_batch=2,
            description="UNet, base width 16: maxpool downs, ConvTranspose2d and bilinear (align_corners True/False) ups",
            slow=True,
        ),
    ]
}
