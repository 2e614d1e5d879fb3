"""The one bucket scheme of mixgemm's tuning data: every problem falls into a bucket computed from its arithmetic, and
measured numbers are stored per bucket (region of buckets), never per exact layer shape.

Coordinates (all integers, so a bucket is a cell of a fixed grid):

* ``k``, ``n``: the half-octave class of K (in features) and N (out features), ``round(2 log2 v)``. A class spans a
  factor 2^0.5 (edges at 2^((c - 0.5) / 2): class 24 is 3445..4870, 26 is 6889..9741, 28 is 13778..19483, 30 is
  27555..38967). Half an octave because the LLM layer sizes the tables were measured on are powers of two and 1.75 x
  powers of two (4096, 8192, 14336, 28672 -> 24, 26, 28, 30): each measured size is its own class, and sizes within
  about +-19% of it share that class.
* derived: ``aspect = n - k`` (N / K in half-octaves: > 0 for up / gate projections, < 0 for down projections) and
  ``size = n + k`` (the weight's element count in half-octaves; its bytes are that times bits / 8).
* ``m``: the power-of-two bucket of M (1, 2, 4, ..., 16384; the smallest power of two >= M, capped).

A table entry covers a :class:`Region` of (k, n) classes: inclusive ranges on k, n, aspect and size (open where
None), or a union of such ranges. A section's entries are checked to be disjoint, and a section marked complete must
cover every bucket (:func:`check_partition`), so any shape falls into exactly one entry; in a partial section a
bucket that no entry covers uses the kernel's own rule. Each entry carries ``source`` (which benchmark measured it)
and, where it was measured on one layer, ``measured`` (that layer's K and N; it must lie inside the entry's region).
Within an entry, configs are listed per M bucket; an M bucket without its own config takes the nearest listed one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

M_BUCKETS = tuple(1 << i for i in range(15))  # 1 .. 16384
# the grid the partition checks walk: classes 0..44 are sizes 1 .. 2^22, beyond any layer; open ranges cover the rest
GRID = range(0, 45)


def half_octave(v: int) -> int:
    """The half-octave class of a positive size: round(2 log2 v) (4096 -> 24, 5120 -> 25, 6144 -> 25, 8192 -> 26)."""
    if v < 1:
        raise ValueError(f"a layer size must be positive, got {v}")
    return round(2 * math.log2(v))


def class_range(c: int) -> tuple[int, int]:
    """The sizes (inclusive) of half-octave class c."""
    lo = 1 if c == 0 else math.floor(2 ** ((c - 0.5) / 2)) + 1
    return lo, math.floor(2 ** ((c + 0.5) / 2))


def pow2_at_least(m: int) -> int:
    """The smallest power of two >= m (1 for m <= 1)."""
    return 1 << (max(int(m), 1) - 1).bit_length()


def m_bucket(m: int) -> int:
    """The power-of-two bucket of M: the smallest power of two >= M, capped at 16384 (the linear tables' largest)."""
    return min(pow2_at_least(m), M_BUCKETS[-1])


@dataclass(frozen=True)
class ShapeBucket:
    """The (k, n) cell of a layer shape (see the module docstring)."""

    k: int
    n: int

    @classmethod
    def of(cls, k: int, n: int) -> ShapeBucket:
        return cls(half_octave(k), half_octave(n))

    @property
    def aspect(self) -> int:
        return self.n - self.k

    @property
    def size(self) -> int:
        return self.n + self.k

    @property
    def key(self) -> str:
        return f"k{self.k}/n{self.n}"

    def describe(self) -> str:
        (k0, k1), (n0, n1) = class_range(self.k), class_range(self.n)
        return f"bucket {self.key} (K {k0}..{k1}, N {n0}..{n1})"


_AXES = ("k", "n", "aspect", "size")


@dataclass(frozen=True)
class Range:
    """Inclusive bounds on one bucket coordinate; None: open."""

    lo: int | None = None
    hi: int | None = None

    def __contains__(self, v: int) -> bool:
        return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)

    def describe(self, axis: str) -> str:
        if self.lo is not None and self.lo == self.hi:
            return f"{axis} = {self.lo}"
        if self.lo is None:
            return f"{axis} <= {self.hi}"
        if self.hi is None:
            return f"{axis} >= {self.lo}"
        return f"{self.lo} <= {axis} <= {self.hi}"


@dataclass(frozen=True)
class Box:
    """One box of buckets: ranges on k, n, aspect and size (a missing axis is unbounded)."""

    k: Range = Range()
    n: Range = Range()
    aspect: Range = Range()
    size: Range = Range()

    def contains(self, b: ShapeBucket) -> bool:
        return all(getattr(b, axis) in getattr(self, axis) for axis in _AXES)

    def describe(self) -> str:
        parts = [getattr(self, a).describe(a) for a in _AXES if getattr(self, a) != Range()]
        return ", ".join(parts) or "any shape"


@dataclass(frozen=True)
class Region:
    """A union of boxes of buckets."""

    boxes: tuple[Box, ...]

    def contains(self, b: ShapeBucket) -> bool:
        return any(box.contains(b) for box in self.boxes)

    def describe(self) -> str:
        return " or ".join(f"({box.describe()})" if len(self.boxes) > 1 else box.describe() for box in self.boxes)

    @classmethod
    def cell(cls, k: int, n: int) -> Region:
        """The single bucket of a K x N layer."""
        b = ShapeBucket.of(k, n)
        return cls((Box(k=Range(b.k, b.k), n=Range(b.n, b.n)),))

    @classmethod
    def parse(cls, spec, where: str) -> Region:
        """From JSON: {"k": [lo, hi], "aspect": [lo, null], ...} or a list of such boxes ({} is any shape)."""
        boxes = []
        for box in spec if isinstance(spec, list) else [spec]:
            if not isinstance(box, dict) or set(box) - set(_AXES):
                raise ValueError(f"{where}: a region box is an object with keys among {_AXES}, got {box!r}")
            ranges = {}
            for axis, bounds in box.items():
                if (not isinstance(bounds, list) or len(bounds) != 2
                        or not all(v is None or isinstance(v, int) for v in bounds)):
                    raise ValueError(f"{where}: {axis} must be [lo, hi] (integers or null), got {bounds!r}")
                ranges[axis] = Range(*bounds)
            boxes.append(Box(**ranges))
        if not boxes:
            raise ValueError(f"{where}: empty region")
        return cls(tuple(boxes))


@dataclass(frozen=True)
class BucketEntry:
    """Measured data for a region of buckets: ``value`` (a config, a {M bucket: config} map, a crossover M...),
    ``source`` (which benchmark measured it), ``measured`` (K, N) of the layer it was measured on, when one."""

    region: Region
    value: object
    source: str
    measured: tuple[int, int] | None = None

    def where(self, bucket: ShapeBucket) -> str:
        on = f"; measured on K {self.measured[0]} x N {self.measured[1]}" if self.measured else ""
        return f"{bucket.describe()} in entry [{self.region.describe()}]{on}; source: {self.source}"


def find(entries, bucket: ShapeBucket) -> BucketEntry | None:
    """The entry whose region holds ``bucket`` (None when none does; check_partition makes it at most one)."""
    for e in entries:
        if e.region.contains(bucket):
            return e
    return None


def _grid_cells(region: Region) -> set[tuple[int, int]]:
    """The (k, n) cells of GRID that ``region`` holds (what Region.contains says of each, walked per box along its k
    and n ranges: the tables are checked at import)."""
    cells = set()
    for box in region.boxes:
        ns = [n for n in GRID if n in box.n]
        for k in (k for k in GRID if k in box.k):
            cells.update((k, n) for n in ns if n - k in box.aspect and n + k in box.size)
    return cells


def check_partition(entries, where: str, complete: bool) -> None:
    """Raise ValueError unless the entries' regions are disjoint on the grid (and, when ``complete``, cover it), and
    each entry's measured layer lies in its own region."""
    for e in entries:
        if e.measured is not None and not e.region.contains(ShapeBucket.of(*e.measured)):
            raise ValueError(f"{where}: the entry measured on K {e.measured[0]} x N {e.measured[1]} does not cover "
                             f"that layer's bucket (region {e.region.describe()})")
    covering: dict[tuple[int, int], list] = {}
    for e in entries:
        for cell in _grid_cells(e.region):
            covering.setdefault(cell, []).append(e)
    for k in GRID:
        for n in GRID:
            b = ShapeBucket(k, n)
            hits = covering.get((k, n), [])
            if len(hits) > 1:
                raise ValueError(f"{where}: {b.describe()} is in {len(hits)} entries: "
                                 + "; ".join(e.region.describe() for e in hits))
            if complete and not hits:
                raise ValueError(f"{where}: {b.describe()} is in no entry")


def nearest_m(configs: dict, m: int) -> int:
    """The M bucket of m if ``configs`` ({M bucket (str or int): value}) lists it, else the nearest listed bucket (log
    distance; ties to the larger)."""
    b = m_bucket(m)
    return min((int(x) for x in configs), key=lambda v: (abs(math.log2(v) - math.log2(b)), -v))


class SourcedConfig(dict):
    """A config (a plain dict to every reader) that also says where it came from (``source``), for
    mixgemm.explain: the registry reports it as the choice's config_source."""

    def __init__(self, config: dict, source: str):
        super().__init__(config)
        self.source = source
