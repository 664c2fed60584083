#!/usr/bin/env python
"""Train the bundled default model of kuiper-xp: a small CNN on scikit-learn's digits.

Run from the repository root:

    python scripts/train_digits.py

Writes into ``kuiper_xp/data/``:

* ``digits.pnnx.param`` / ``digits.pnnx.bin``: the model exported with pnnx (dynamic batch);
* ``digits_test.npz``: ``images`` (float32, N x 1 x 8 x 8, already preprocessed), ``labels``
  (int64) and ``torch_logits`` (float32, N x 10, torch's output for ``images``);
* ``digits_meta.json``: preprocessing recipe, seed, versions and torch's test accuracy.

Everything is seeded and runs single-threaded, so reruns give the same weights and files.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

SEED = 0
TEST_SIZE = 0.25
EPOCHS = 40
BATCH_SIZE = 64
LR = 3e-3
WEIGHT_DECAY = 1e-4
C1, C2, C3, HIDDEN = 8, 16, 32, 32  # channel widths and hidden units: ~10k parameters

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "kuiper_xp" / "data"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


class DigitsNet(nn.Module):
    """8x8x1 -> 10 logits; ~10k parameters (BatchNorm is folded into the convs by pnnx)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, C1, 3, padding=1),
            nn.BatchNorm2d(C1),
            nn.ReLU(),
            nn.Conv2d(C1, C2, 3, padding=1),
            nn.BatchNorm2d(C2),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(C2, C3, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.classifier = nn.Sequential(
            nn.Linear(C3 * 2 * 2, HIDDEN),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(HIDDEN, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random shift of up to one pixel (zero padding), applied per sample.

    Works on preprocessed images; the padding value is the preprocessed value of a 0 pixel.
    """
    n = x.shape[0]
    pad_value = float(x.amin())
    padded = nn.functional.pad(x, (1, 1, 1, 1), value=pad_value)
    dy = torch.randint(0, 3, (n,), generator=gen)
    dx = torch.randint(0, 3, (n,), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        out[i] = padded[i, :, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8]
    return out


def main() -> int:
    t0 = time.perf_counter()
    seed_everything(SEED)

    digits = load_digits()
    images = digits.images.astype(np.float32) / np.float32(16.0)  # (N, 8, 8) in [0, 1]
    labels = digits.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(labels)), test_size=TEST_SIZE, random_state=SEED, stratify=labels
    )

    # Normalise with scalar mean/std of the training split (after the /16 scaling).
    mean = float(images[idx_train].mean())
    std = float(images[idx_train].std())
    mean32, std32 = np.float32(mean), np.float32(std)
    x_all = ((images - mean32) / std32).astype(np.float32)[:, None, :, :]

    x_train = torch.from_numpy(x_all[idx_train])
    y_train = torch.from_numpy(labels[idx_train])
    x_test = torch.from_numpy(x_all[idx_test])
    y_test = torch.from_numpy(labels[idx_test])
    print(f"train {len(x_train)}  test {len(x_test)}  mean {mean:.6f}  std {std:.6f}")

    model = DigitsNet()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}")
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)

    def evaluate() -> tuple[float, torch.Tensor]:
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
        return int((logits.argmax(1) == y_test).sum()) / len(y_test), logits

    for epoch in range(1, EPOCHS + 1):
        model.train()
        perm = torch.randperm(len(x_train), generator=gen)
        total, correct, loss_sum = 0, 0, 0.0
        for start in range(0, len(perm), BATCH_SIZE):
            b = perm[start : start + BATCH_SIZE]
            xb = augment(x_train[b], gen)
            yb = y_train[b]
            opt.zero_grad()
            out = model(xb)
            loss = loss_fn(out, yb)
            loss.backward()
            opt.step()
            loss_sum += float(loss) * len(b)
            correct += int((out.argmax(1) == yb).sum())
            total += len(b)
        sched.step()
        acc, _ = evaluate()
        print(
            f"epoch {epoch:2d}/{EPOCHS}  loss {loss_sum / total:.4f}  "
            f"train acc {correct / total:.4f}  test acc {acc:.4f}",
            flush=True,
        )

    model.eval()
    test_acc, logits = evaluate()
    print(
        f"final torch test accuracy: {test_acc:.4f} ({int(round(test_acc * len(y_test)))}"
        f"/{len(y_test)})"
    )

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    import pnnx  # imported late: only needed for the export

    with tempfile.TemporaryDirectory() as tmp:
        pt_path = os.path.join(tmp, "digits.pt")
        pnnx.export(
            model,
            pt_path,
            (torch.rand(1, 1, 8, 8),),
            inputs2=(torch.rand(4, 1, 8, 8),),
        )
        for name in ("digits.pnnx.param", "digits.pnnx.bin"):
            shutil.copyfile(os.path.join(tmp, name), OUT_DIR / name)

    np.savez_compressed(
        OUT_DIR / "digits_test.npz",
        images=x_test.numpy().astype(np.float32),
        labels=y_test.numpy().astype(np.int64),
        torch_logits=logits.numpy().astype(np.float32),
    )

    try:
        from importlib.metadata import version

        pnnx_version = version("pnnx")
    except Exception:  # pragma: no cover - metadata missing
        pnnx_version = "unknown"
    meta = {
        "dataset": "sklearn.datasets.load_digits",
        "preprocess": {
            "recipe": "x = (image / 16.0 - mean) / std, float32, shape (N, 1, 8, 8)",
            "scale": 16.0,
            "mean": float(mean32),
            "std": float(std32),
            "input_shape": [None, 1, 8, 8],
            "dtype": "float32",
        },
        "split": {
            "method": "sklearn.model_selection.train_test_split(stratify=labels)",
            "test_size": TEST_SIZE,
            "random_state": SEED,
            "n_train": len(idx_train),
            "n_test": len(idx_test),
        },
        "classes": list(range(10)),
        "output": "logits (N, 10); class = argmax",
        "n_parameters": n_params,
        "epochs": EPOCHS,
        "seed": SEED,
        "torch_test_accuracy": test_acc,
        "torch_version": torch.__version__,
        "pnnx_version": pnnx_version,
        "python_version": sys.version.split()[0],
        "numpy_version": np.__version__,
    }
    with open(OUT_DIR / "digits_meta.json", "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    total_size = 0
    for p in sorted(OUT_DIR.iterdir()):
        if p.is_file():
            total_size += p.stat().st_size
            print(f"  {p.relative_to(ROOT)}  {p.stat().st_size} bytes")
    print(f"total {total_size} bytes; elapsed {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
