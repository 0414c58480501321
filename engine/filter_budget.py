r"""Monkey: how to spend a fixed filter memory budget across the runs of an LSM tree.

Dayan, Athanassoulis, Idreos, "Monkey: Optimal Navigable Key-Value Store", SIGMOD 2017.

The problem
-----------
A lookup of a key that is not in the DB probes one filter per *run*: every L0 table is a run
(L0 tables overlap), and every level L1+ is one run (its tables do not overlap, so at most one
table's filter is probed). A probe of run i with false-positive rate p_i wastes one table read
with probability p_i, so the expected number of wasted reads per missing-key lookup is

    R = sum_i p_i .

A classic Bloom filter holding n_i keys at false-positive rate p_i needs

    bits(p_i) = n_i * (-ln p_i) / (ln 2)^2

bits. Given a total of M bits, minimise R subject to sum_i n_i * (-ln p_i) / ln(2)^2 = M and
0 < p_i <= 1.

The solution (Lagrange multipliers)
-----------------------------------
L = sum_i p_i + lambda * (sum_i n_i (-ln p_i) / ln(2)^2 - M).
dL/dp_i = 1 - lambda * n_i / (p_i ln(2)^2) = 0  =>  p_i = (lambda / ln(2)^2) * n_i = c * n_i.

Every run's FPR is proportional to its number of entries: small runs (L0, L1) get many bits per
key, the big last level few. Substituting into the memory constraint over the set F of runs that
get a filter (p_i < 1):

    sum_{i in F} n_i * (-ln c - ln n_i) = M ln(2)^2
    ln c = -(M ln(2)^2 + sum_{i in F} n_i ln n_i) / sum_{i in F} n_i

The bits per key of run i are then ``-ln(p_i) / ln(2)^2 = -ln(c n_i) / ln(2)^2``. Two bounds
make it iterative (each step moves runs out of F and solves c again; it stops when nothing moves,
after at most k steps):

- A run whose bits come out under ``min_bits`` (default MIN_BITS_PER_KEY = 1: the table builder
  builds no filter that weak, it would cost a probe and save almost nothing) gets no filter: the
  largest run (it has the fewest bits) leaves F and its memory goes to the others, as Monkey
  does for runs with c * n_i >= 1 (p = 1, zero bits). Otherwise that run's share would be spent
  on a filter that is never built while the smaller runs were held to fewer bits.
- Then a run whose bits come out over MAX_BITS_PER_KEY (tiny runs) gets exactly the cap, and the
  memory it leaves goes to the others (M shrinks by the capped runs' bits).

Dropping the weak run first keeps the solve feasible (the capped runs' bits always fit in M).

Coverage: not every run is probed
----------------------------------
A get probes a run only where one of its tables' key ranges holds the key: a level whose tables
span 40% of the key space is probed by 40% of the misses. With c_i the probability that a miss
probes run i (its *coverage*, 0 < c_i <= 1), the expected wasted reads are R = sum_i c_i p_i,
and the same Lagrange step gives p_i = c * n_i / c_i: every ``n_i`` above becomes ``n_i / c_i``
inside the logarithm (``ln c = -(M ln(2)^2 + sum n_i ln(n_i / c_i)) / sum n_i``), and the run
with the fewest bits is the one with the largest n_i / c_i. Two runs probed in proportion to
their sizes (c_i proportional to n_i) get equal bits. ``coverage=None`` is c_i = 1 everywhere
(the classic Monkey). engine/filter_plan.py estimates c_i from the tables' key ranges.

The uniform alternative spends the same M as M / N bits per key everywhere (N = sum n_i), giving
R_uniform = fpr(M / N) * sum_i c_i. :func:`allocate` returns both so the report can show the
gain. The allocation uses the classic formula; the expected FPR reported for each level uses the
configured policy's own FPR function when one is given (a blocked Bloom filter is a little worse
than classic at the same bits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

LN2_SQ = math.log(2) ** 2
MAX_BITS_PER_KEY = 40.0
"""Cap on bits per key for tiny runs (the optimum goes to infinity as n -> 0)."""
MIN_BITS_PER_KEY = 1.0
"""Below this a run gets no filter (engine/filter_plan.py builds none that weak)."""
MIN_COVERAGE = 1e-3
"""Floor on a run's coverage, so n / c stays finite."""


def classic_fpr(bits_per_key: float) -> float:
    """False-positive rate of an optimal classic Bloom filter: exp(-b ln(2)^2)."""
    if bits_per_key <= 0:
        return 1.0
    return math.exp(-bits_per_key * LN2_SQ)


def classic_bits(fpr: float) -> float:
    """Bits per key a classic Bloom filter needs for ``fpr``."""
    if fpr >= 1.0:
        return 0.0
    return -math.log(fpr) / LN2_SQ


@dataclass(frozen=True)
class Allocation:
    """The result of :func:`allocate`: bits per key per run, and expected reads per miss."""

    bits_per_key: tuple[float, ...]
    fpr: tuple[float, ...]
    expected_reads_per_miss: float
    uniform_bits_per_key: float
    uniform_expected_reads_per_miss: float
    budget_bits: float
    used_bits: float

    def as_dict(self) -> dict:
        return {
            "bits_per_key": [round(b, 3) for b in self.bits_per_key],
            "fpr": list(self.fpr),
            "expected_reads_per_miss": self.expected_reads_per_miss,
            "uniform_bits_per_key": round(self.uniform_bits_per_key, 3),
            "uniform_expected_reads_per_miss": self.uniform_expected_reads_per_miss,
            "budget_bytes": int(self.budget_bits // 8),
            "used_bytes": int(self.used_bits // 8),
        }


def allocate(run_entries: Sequence[int], budget_bytes: float,
             fpr_fn: Callable[[float], float] = classic_fpr,
             min_bits: float = MIN_BITS_PER_KEY,
             coverage: Sequence[float] | None = None) -> Allocation:
    """Optimal bits per key for runs of ``run_entries`` entries sharing ``budget_bytes``.

    ``coverage``: per run the probability that a missing-key lookup probes it (None: 1 each;
    values are clamped to [MIN_COVERAGE, 1]). Returns bits per key per run (same order; each 0
    or in [min_bits, MAX_BITS_PER_KEY]), each run's expected FPR under ``fpr_fn``, the
    coverage-weighted sum (expected wasted table reads per missing-key lookup), and the same for
    uniform bits. O(k^2) for k runs (k is small: the L0 tables plus six levels).
    """
    n = [max(0, int(x)) for x in run_entries]
    if coverage is None:
        cov = [1.0] * len(n)
    else:
        cov = [min(1.0, max(MIN_COVERAGE, float(c))) for c in coverage]
        if len(cov) != len(n):
            raise ValueError("coverage needs one value per run")
    w = [n[i] / cov[i] for i in range(len(n))]  # Monkey's "size" of a run: entries / coverage
    m_bits = max(0.0, float(budget_bytes) * 8.0)
    total = sum(n)
    k = len(n)
    bits = [0.0] * k
    if total == 0 or m_bits == 0.0:
        fpr = tuple(1.0 if x else 0.0 for x in n)
        r = float(sum(p * c for p, c in zip(fpr, cov)))
        return Allocation(tuple(bits), fpr, r, 0.0, r, m_bits, 0.0)
    active = [i for i in range(k) if n[i] > 0]
    capped: list[int] = []
    while active:
        m_free = m_bits - MAX_BITS_PER_KEY * sum(n[i] for i in capped)
        s = sum(n[i] for i in active)
        s_log = sum(n[i] * math.log(w[i]) for i in active)
        ln_c = -(m_free * LN2_SQ + s_log) / s
        want = {i: -(ln_c + math.log(w[i])) / LN2_SQ for i in active}
        worst = max(active, key=lambda i: w[i])  # the largest n / c has the fewest bits
        if want[worst] < max(min_bits, 0.0):  # too weak to build (or p >= 1): no filter
            active.remove(worst)
            continue
        # Every active run now has positive bits summing to m_free, so the capped runs' bits
        # fit in it: m_free stays positive.
        over = [i for i in active if want[i] > MAX_BITS_PER_KEY]
        if over:  # tiny runs: held at the cap, the rest of the memory goes to the others
            capped.extend(over)
            active = [i for i in active if i not in over]
            continue
        for i in active:
            bits[i] = want[i]
        break
    for i in capped:
        bits[i] = MAX_BITS_PER_KEY
    used = sum(bits[i] * n[i] for i in range(k))
    fpr = tuple((fpr_fn(bits[i]) if n[i] else 0.0) for i in range(k))
    uniform = min(MAX_BITS_PER_KEY, m_bits / total)
    u_fpr = sum(fpr_fn(uniform) * cov[i] for i in range(k) if n[i])
    r = sum(fpr[i] * cov[i] for i in range(k))
    return Allocation(tuple(bits), fpr, float(r), uniform, float(u_fpr), m_bits, used)


def expected_reads_per_miss(run_entries: Sequence[int], bits_per_key: Sequence[float],
                            fpr_fn: Callable[[float], float] = classic_fpr,
                            coverage: Sequence[float] | None = None) -> float:
    """Sum of the runs' FPRs, each weighted by its coverage (None: 1): expected wasted table
    reads for one missing-key lookup."""
    cov = [1.0] * len(run_entries) if coverage is None else list(coverage)
    return float(sum(fpr_fn(b) * c for x, b, c in zip(run_entries, bits_per_key, cov) if x))
