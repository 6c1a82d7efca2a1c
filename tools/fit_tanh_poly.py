"""Fit the polynomial of the fused loops' float32 tanh on small arguments.

csrc/executors/tpu/fused_kernels.inc computes tanh(x) for |x| < 0.625 as
|x| + |x| z P(z), z = x^2, with P of degree 4, and above that from exp. This script
finds P: a least-squares fit in float64 on Chebyshev nodes of (0, 0.625), weighted by
each point's contribution to the relative error of tanh, re-weighted towards the worst
points (a cheap stand-in for a Remez exchange). It prints P's coefficients as float32
literals (constant term first) and the fit's largest relative error in float32 ulp
(units of 2^-24 relative). Needs numpy only; runs in well under a second.

Usage: python tools/fit_tanh_poly.py [--degree 4] [--limit 0.625]
"""
import argparse

import numpy as np


def fit(degree, limit, nodes=20000, rounds=30):
    """Returns (coefficients of P, constant first, as float32; worst relative error in ulp)."""
    x = np.abs(np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes) * limit)
    x = x[x > 1e-4]  # below, z P(z) is far under an ulp of 1 and adds nothing to the fit
    z = x * x
    target = (np.tanh(x) / x - 1) / z  # the P(z) that would be exact
    basis = np.vstack([z**k for k in range(degree + 1)]).T
    scale = z * x / np.tanh(x)  # an error e in P changes tanh by e * scale, relatively
    weight = np.ones_like(z)
    for _ in range(rounds):
        coef, *_ = np.linalg.lstsq(basis * (weight * scale)[:, None], target * weight * scale, rcond=None)
        err = np.abs((basis @ coef - target) * scale)
        weight *= 1 + err / err.max()
    return coef.astype(np.float32), err.max() / 2.0**-24


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degree", type=int, default=4)
    parser.add_argument("--limit", type=float, default=0.625)
    args = parser.parse_args()
    coef, worst = fit(args.degree, args.limit)
    print("P coefficients, constant first:", ", ".join(f"{c:.9e}f" for c in coef))
    print(f"largest relative error of the fit: {worst:.3f} ulp")


if __name__ == "__main__":
    main()
