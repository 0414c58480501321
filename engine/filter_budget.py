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

Runs for which c * n_i >= 1 would get a useless filter (p = 1, zero bits): they are removed from
F (largest first) and c is solved again, until every remaining run has c * n_i < 1. The bits per
key of run i are then ``-ln(p_i) / ln(2)^2 = -ln(c n_i) / ln(2)^2``.

The uniform alternative spends the same M as M / N bits per key everywhere (N = sum n_i), giving
R_uniform = k * fpr(M / N) for k runs. :func:`allocate` returns both so the report can show the
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


def allocate(run_entries: Sequence[int], budget_bytes: int,
             fpr_fn: Callable[[float], float] = classic_fpr) -> Allocation:
    """Optimal bits per key for runs of ``run_entries`` entries sharing ``budget_bytes``.

    Returns bits per key per run (same order), each run's expected FPR under ``fpr_fn``, their
    sum (expected wasted table reads per missing-key lookup), and the same for uniform bits.
    O(k^2) for k runs (k is small: the L0 tables plus six levels).
    """
    n = [max(0, int(x)) for x in run_entries]
    m_bits = max(0.0, float(budget_bytes) * 8.0)
    total = sum(n)
    k = len(n)
    bits = [0.0] * k
    if total == 0 or m_bits == 0.0:
        fpr = tuple(1.0 if x else 0.0 for x in n)
        return Allocation(tuple(bits), fpr, float(sum(fpr)), 0.0, float(sum(fpr)), m_bits, 0.0)
    active = [i for i in range(k) if n[i] > 0]
    while active:
        s = sum(n[i] for i in active)
        s_log = sum(n[i] * math.log(n[i]) for i in active)
        ln_c = -(m_bits * LN2_SQ + s_log) / s
        # Runs whose optimal FPR would reach 1 get no filter; drop the largest and solve again.
        worst = max(active, key=lambda i: n[i])
        if ln_c + math.log(n[worst]) >= 0.0:
            active.remove(worst)
            continue
        for i in active:
            bits[i] = min(MAX_BITS_PER_KEY, -(ln_c + math.log(n[i])) / LN2_SQ)
        break
    used = sum(bits[i] * n[i] for i in range(k))
    fpr = tuple((fpr_fn(bits[i]) if n[i] else 0.0) for i in range(k))
    uniform = min(MAX_BITS_PER_KEY, m_bits / total)
    u_fpr = sum(fpr_fn(uniform) for x in n if x)
    return Allocation(tuple(bits), fpr, float(sum(fpr)), uniform, float(u_fpr), m_bits, used)


def expected_reads_per_miss(run_entries: Sequence[int], bits_per_key: Sequence[float],
                            fpr_fn: Callable[[float], float] = classic_fpr) -> float:
    """Sum of the runs' FPRs: expected wasted table reads for one missing-key lookup."""
    return float(sum(fpr_fn(b) for x, b in zip(run_entries, bits_per_key) if x))
