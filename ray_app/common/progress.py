"""Plain progress lines for the steps that can take minutes (featurising a file, screening a library).

One line at most every ``KERMT_PROGRESS_EVERY_S`` seconds (default 30), in the style of the rest of the log, e.g.

    featurising data.csv: 120,000 of 1,000,000 molecules (12%), 3,400/s, about 4m 19s left

No progress bars: job logs (``ray job logs``, CI, a file) keep every redraw of a bar as a line. A step that ends
before the first interval prints nothing; one that printed a line ends with a closing line (count, time, rate).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

EVERY_S_VARIABLE = "KERMT_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 30.0


def every_s() -> float:
    """Seconds between two progress lines (``KERMT_PROGRESS_EVERY_S``; 0 prints one line per update)."""
    value = os.environ.get(EVERY_S_VARIABLE)
    try:
        return DEFAULT_EVERY_S if value is None else max(0.0, float(value))
    except ValueError:
        return DEFAULT_EVERY_S


def duration(seconds: float) -> str:
    """42s, 4m 19s, 2h 03m: a time a person reads at a glance."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


class Progress:
    """Counts work done toward an optional ``total`` and prints a line when the interval has passed.

    ``clock`` and ``out`` are injectable so that the line's arithmetic can be checked with a clock the test drives.
    """

    def __init__(self, label: str, total: int | None = None, unit: str = "molecules",
                 every: float | None = None, clock: Callable[[], float] = time.monotonic,
                 out: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.every = every_s() if every is None else every
        self.clock, self.out = clock, out
        self.started = self.last_line = clock()
        self.done = 0
        self.lines = 0

    def advance(self, count: int) -> None:
        self.done += count
        now = self.clock()
        if now - self.last_line >= self.every and (self.total is None or self.done < self.total):
            self.last_line = now
            self.lines += 1
            self.out(self.line(now))

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            text = f"{self.label}: {self.done:,} of {self.total:,} {self.unit} ({self.done / self.total:.0%})"
        else:
            text = f"{self.label}: {self.done:,} {self.unit}"
        text += f", {rate:,.0f}/s"
        if self.total and rate > 0:
            text += f", about {duration((self.total - self.done) / rate)} left"
        return text

    def finish(self) -> None:
        """The closing line, only after a progress line (a quick step stays silent)."""
        if self.lines:
            elapsed = max(self.clock() - self.started, 1e-9)
            self.out(f"{self.label}: {self.done:,} {self.unit} in {duration(elapsed)} "
                     f"({self.done / elapsed:,.0f}/s)")
