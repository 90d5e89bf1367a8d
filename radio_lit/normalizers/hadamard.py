"""Normalized Hadamard matrices (PHI-S section 2.2.4, appendix A.1.1).

A normalized Hadamard matrix ``H [n, n]`` has entries ``±1/sqrt(n)`` and ``H @ H.T == I``.
HCA (eq. 19) and PHI-S (eq. 25) use it as the rotation that spreads every eigenvalue evenly
over all output channels. Orders are built from the rules of appendix A.1.1:

- Sylvester (eq. 18): ``S(2^k)``;
- Paley I: ``P1(q + 1)`` for a prime power ``q ≡ 3 (mod 4)``;
- Paley II: ``P2(2(q + 1))`` for a prime power ``q ≡ 1 (mod 4)``;
- Kronecker products ``H_a ⊗ H_b`` of reachable orders.

Prime powers ``q = p^k`` with ``k > 1`` use arithmetic in GF(p^k), built on the smallest monic
irreducible polynomial of degree ``k`` (see :func:`_irreducible`).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

__all__ = ["hadamard", "is_hadamard_order"]

# A construction: ("sylvester", n), ("paley1", q), ("paley2", q) or ("kron", a, b).
_Recipe = tuple[str, int] | tuple[str, int, int]


def hadamard(n: int) -> Tensor:
    """The canonical normalized Hadamard matrix of order ``n``.

    Canonical choice (deterministic, the same matrix on every call): the first rule that
    applies among Sylvester if ``n`` is a power of two (``n = 1`` included), else Paley I,
    else Paley II, else ``H_a ⊗ H_b`` with the smallest ``a >= 2`` such that ``a`` and
    ``b = n / a`` are both reachable (which peels off powers of two first and gives the
    ``S(2^k) ⊗ P(m)`` forms of appendix A.1.1). Rows are then negated where the diagonal is
    negative, so ``diag(H) > 0`` (the sign convention of PHI-S figure 4).

    Covers the common ViT widths: 768 = S(2)⊗P1(384), 1024 = S(1024), 1152 = P1(1152),
    1280 = P1(1280), 1408 = S(32)⊗P1(44), 1536 = S(4)⊗P1(384), and every other order the
    rules reach (see :func:`is_hadamard_order`); not e.g. 6 or 92.

    Args:
        n: order of the matrix.

    Returns:
        ``[n, n]`` float64 tensor with entries ``±1/sqrt(n)`` and orthonormal rows; a fresh
        tensor each call (the cache holds an internal copy), computed on the CPU whatever
        the default device (a normalizer built under ``torch.device("meta")``, as
        ``radio-lit plan`` builds a run, still gets its exact matrix).

    Raises:
        ValueError: ``n`` is not an order these rules reach (e.g. 6, 92), with the nearest
            constructible orders.
    """
    if not is_hadamard_order(n):
        raise ValueError(_unsupported_message(n))
    with torch.device("cpu"):
        return _signs(n).to(torch.float64) / math.sqrt(n)


def is_hadamard_order(n: int) -> bool:
    """Whether :func:`hadamard` can build order ``n`` (always 1, 2 or a multiple of 4)."""
    return isinstance(n, int) and _recipe(n) is not None


def _unsupported_message(n: object) -> str:
    rules = (
        "Sylvester 2^k, Paley I q+1 (prime power q ≡ 3 mod 4), Paley II 2(q+1) "
        "(prime power q ≡ 1 mod 4) and Kronecker products of these"
    )
    if not isinstance(n, int) or n < 1:
        return f"No Hadamard matrix of order {n!r}: the order must be a positive int ({rules})."
    below = next((m for m in range(n - 1, 0, -1) if _recipe(m)), None)
    above = next(m for m in range(n + 1, 2 * n + 1) if _recipe(m))
    nearest = f"{below} or {above}" if below else str(above)
    return (
        f"No Hadamard matrix of order {n} can be constructed ({rules}; a Hadamard order is "
        f"1, 2 or a multiple of 4). Nearest constructible orders: {nearest}."
    )


@functools.cache
def _recipe(n: int) -> _Recipe | None:
    """The canonical construction of order ``n`` (see :func:`hadamard`), ``None`` if none."""
    if n < 1 or (n > 2 and n % 4):
        return None
    if n & (n - 1) == 0:
        return ("sylvester", n)
    if (n - 1) % 4 == 3 and _prime_power(n - 1):
        return ("paley1", n - 1)
    if (n // 2 - 1) % 4 == 1 and _prime_power(n // 2 - 1):
        return ("paley2", n // 2 - 1)
    for a in range(2, math.isqrt(n) + 1):
        if n % a == 0 and _recipe(a) and _recipe(n // a):
            return ("kron", a, n // a)
    return None


@functools.lru_cache(maxsize=32)
def _signs(n: int) -> Tensor:
    """Unnormalized ±1 Hadamard matrix of order ``n`` with positive diagonal, ``[n, n]`` int8."""
    recipe = _recipe(n)
    assert recipe is not None
    kind, *args = recipe
    if kind == "sylvester":
        h = torch.ones(1, 1, dtype=torch.int8)
        while h.shape[0] < n:  # eq. 18: H_n = [[H, H], [H, -H]]
            h = torch.kron(_int8([[1, 1], [1, -1]]), h)
    elif kind == "paley1":  # H = I + [[0, 1^T], [-1, Q]], Q antisymmetric
        h = _bordered(_jacobsthal(args[0]), corner=0, column=-1) + torch.eye(n, dtype=torch.int8)
    elif kind == "paley2":  # 0 -> [[1, -1], [-1, -1]], ±1 -> ±[[1, 1], [1, -1]] in C
        conference = _bordered(_jacobsthal(args[0]), corner=0, column=1)
        h = torch.kron(conference, _int8([[1, 1], [1, -1]])) + torch.kron(
            torch.eye(args[0] + 1, dtype=torch.int8), _int8([[1, -1], [-1, -1]])
        )
    else:
        h = torch.kron(_signs(args[0]), _signs(args[1]))
    return h * h.diagonal()[:, None]


def _int8(rows: list[list[int]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.int8)


def _bordered(q_matrix: Tensor, corner: int, column: int) -> Tensor:
    """``[[corner, 1^T], [column * 1, Q]]``, ``[q + 1, q + 1]`` int8."""
    q = q_matrix.shape[0]
    out = torch.full((q + 1, q + 1), column, dtype=torch.int8)
    out[0, :] = 1
    out[0, 0] = corner
    out[1:, 1:] = q_matrix
    return out


def _jacobsthal(q: int) -> Tensor:
    """Jacobsthal matrix ``Q[a, b] = χ(a - b)`` over GF(q), ``[q, q]`` int8.

    ``χ`` is the quadratic character (1 on nonzero squares, -1 on non-squares, 0 at 0).
    Field elements are indexed by ``a = Σ_i a_i p^i``, the polynomial ``Σ_i a_i x^i``.
    """
    power = _prime_power(q)
    assert power is not None
    p, k = power
    weights = p ** torch.arange(k)
    digits = torch.arange(q)[:, None] // weights % p  # [q, k]
    squares = _square(digits, _irreducible(p, k), p)
    chi = torch.full((q,), -1, dtype=torch.int8)
    chi[(squares * weights).sum(-1)] = 1
    chi[0] = 0
    difference = torch.zeros(q, q, dtype=torch.int32)
    for i in range(k):  # subtraction in GF(p^k) is digit-wise mod p
        d = digits[:, i].to(torch.int32)
        difference += (d[:, None] - d[None, :]) % p * int(weights[i])
    return chi[difference.long()]


def _square(digits: Tensor, modulus: tuple[int, ...], p: int) -> Tensor:
    """Squares of the field elements ``[q, k]`` (digits) modulo the monic ``x^k + Σ c_i x^i``."""
    k = digits.shape[1]
    product = torch.zeros(digits.shape[0], 2 * k - 1, dtype=torch.int64)
    for i in range(k):
        for j in range(k):
            product[:, i + j] += digits[:, i] * digits[:, j]
    for degree in range(2 * k - 2, k - 1, -1):  # x^k ≡ -Σ c_i x^i
        top = product[:, degree] % p
        for i, c in enumerate(modulus):
            product[:, degree - k + i] -= top * c
    return product[:, :k] % p


@functools.cache
def _irreducible(p: int, k: int) -> tuple[int, ...]:
    """Lower coefficients ``(c_0, ..., c_{k-1})`` of the irreducible monic ``x^k + Σ c_i x^i``
    over GF(p) with the smallest ``Σ c_i p^i`` (``x`` itself when ``k = 1``)."""
    for code in range(p**k):
        poly = [code // p**i % p for i in range(k)] + [1]
        divisors = (
            [d // p**i % p for i in range(degree)] + [1]
            for degree in range(1, k // 2 + 1)
            for d in range(p**degree)
        )
        if all(any(_poly_mod(poly, divisor, p)) for divisor in divisors):
            return tuple(poly[:-1])
    raise AssertionError(f"no irreducible polynomial of degree {k} over GF({p})")


def _poly_mod(a: list[int], monic: list[int], p: int) -> list[int]:
    """Remainder of ``a`` divided by a monic polynomial over GF(p) (coefficients low to high)."""
    a = list(a)
    for shift in range(len(a) - len(monic), -1, -1):
        top = a[shift + len(monic) - 1]
        for i, c in enumerate(monic):
            a[shift + i] = (a[shift + i] - top * c) % p
    return a[: len(monic) - 1]


def _prime_power(q: int) -> tuple[int, int] | None:
    """``(p, k)`` with ``q = p^k`` for an odd prime ``p``, else ``None``."""
    if q < 3 or q % 2 == 0:
        return None
    p = next(d for d in range(3, q + 1, 2) if q % d == 0 or d * d > q)
    p = p if q % p == 0 else q
    k = 0
    while q % p == 0:
        q, k = q // p, k + 1
    return (p, k) if q == 1 else None
