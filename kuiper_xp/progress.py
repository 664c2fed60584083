"""A tiny progress bar for the command line, drawn on stderr only when stderr is a terminal.

    with Progress(total=450, desc="running") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))

When the stream is not a TTY (a pipe, a file, pytest's capture) nothing is written at all, so
logs and captured output stay clean. No dependencies.
"""

from __future__ import annotations

import sys
import time
from typing import IO

__all__ = ["Progress"]


class Progress:
    """A one-line bar ``desc [#####.....] 120/450  27%  1.2k/s`` redrawn in place.

    ``enabled=None`` (the default) draws only when ``stream.isatty()``; redraws are limited to one
    per ``min_interval`` seconds (the final state is always drawn). :meth:`close` erases the line.
    """

    def __init__(self, total: int, desc: str = "", stream: IO[str] | None = None,
                 enabled: bool | None = None, width: int = 28, unit: str = "",
                 min_interval: float = 0.1):
        self.total = max(int(total), 0)
        self.desc = desc
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            enabled = _isatty(self.stream)
        self.enabled = bool(enabled)
        self.width = width
        self.unit = unit
        self.min_interval = min_interval
        self.n = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = 0  # characters of the last line written
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled or self._closed:
            return
        now = time.perf_counter()
        if now - self._last_draw >= self.min_interval or self.n >= self.total:
            self._last_draw = now
            self._draw(now)

    def render(self, now: float | None = None) -> str:
        """The bar's text for the current count."""
        now = time.perf_counter() if now is None else now
        frac = min(self.n / self.total, 1.0) if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = max(now - self._start, 1e-9)
        rate = self.n / elapsed
        head = f"{self.desc} " if self.desc else ""
        unit = f" {self.unit}" if self.unit else ""
        return f"{head}[{bar}] {self.n}/{self.total}{unit} {frac * 100:3.0f}% {_rate(rate)}/s"

    def _draw(self, now: float) -> None:
        text = self.render(now)
        pad = " " * max(self._drawn - len(text), 0)
        try:
            self.stream.write("\r" + text + pad)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: stop drawing
            self.enabled = False
            return
        self._drawn = len(text)

    def close(self) -> None:
        """Erase the bar (the results that follow start on a clean line)."""
        if self._closed:
            return
        self._closed = True
        if self.enabled and self._drawn:
            try:
                self.stream.write("\r" + " " * self._drawn + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _rate(r: float) -> str:
    if r >= 1e6:
        return f"{r / 1e6:.1f}M"
    if r >= 1e3:
        return f"{r / 1e3:.1f}k"
    return f"{r:.1f}"
