"""Fit the polynomials of the fused loops' own float32 exp and tanh.

csrc/executors/tpu/fused_kernels.inc computes, under set_fused_math("sleef"):
  exp(x)  = 2^n (1 + r + r^2 Q(r)), n = round(x / ln 2), r = x - n ln 2, |r| <= ln(2)/2,
            Q of degree 4;
  tanh(x) = |x| + |x| z P(z), z = x^2, for |x| < 0.625 (above, from exp), P of degree 4.
This script finds Q and P: least-squares fits in float64 on Chebyshev nodes, weighted by
each point's contribution to the relative error of the result and re-weighted towards
the worst points (a cheap stand-in for a Remez exchange). It prints each polynomial's
coefficients as float32 literals (constant term first) and the fit's largest relative
error in float32 ulp (units of 2^-24 relative). Needs numpy only; runs in under a second.

Usage: python tools/fit_fused_math_polys.py
"""

import numpy as np


def weighted_fit(t, target, scale, degree, rounds=30):
    """Coefficients c (constant first) minimizing max |(sum c_k t^k - target) * scale|."""
    basis = np.vstack([t**k for k in range(degree + 1)]).T
    weight = np.ones_like(t)
    for _ in range(rounds):
        coef, *_ = np.linalg.lstsq(basis * (weight * scale)[:, None], target * weight * scale, rcond=None)
        err = np.abs((basis @ coef - target) * scale)
        weight *= 1 + err / err.max()
    return coef.astype(np.float32), err.max() / 2.0**-24


def chebyshev_nodes(limit, count=20000):
    return np.cos(np.pi * (np.arange(count) + 0.5) / count) * limit


def fit_exp(degree=4):
    """Q with exp(r) = 1 + r + r^2 Q(r) on |r| <= ln(2)/2."""
    r = chebyshev_nodes(np.log(2) / 2)
    r = r[np.abs(r) > 1e-5]  # below, r^2 Q(r) is far under an ulp of 1
    return weighted_fit(r, (np.expm1(r) - r) / (r * r), r * r / np.exp(r), degree)


def fit_tanh(degree=4, limit=0.625):
    """P with tanh(x) = x + x z P(z), z = x^2, on 0 < x < limit."""
    x = np.abs(chebyshev_nodes(limit))
    x = x[x > 1e-4]  # below, z P(z) is far under an ulp of 1
    z = x * x
    return weighted_fit(z, (np.tanh(x) / x - 1) / z, z * x / np.tanh(x), degree)


def main():
    for name, (coef, worst) in (("exp Q", fit_exp()), ("tanh P", fit_tanh())):
        print(f"{name} coefficients, constant first: " + ", ".join(f"{c:.9e}f" for c in coef))
        print(f"{name} largest relative error of the fit: {worst:.3f} ulp")


if __name__ == "__main__":
    main()
