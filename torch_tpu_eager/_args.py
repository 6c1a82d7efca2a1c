"""Checks of Python integers passed to the C++ extension's int64 parameters.

pybind11 rejects an int outside int64 with a TypeError that dumps the whole
signature; these raise an error naming the function and the argument instead.
"""

import operator

_INT64_MAX = (1 << 63) - 1


def int64_arg(func: str, name: str, value) -> int:
    """``value`` as an int that fits a C++ int64.

    Raises TypeError when ``value`` is not an integer (``operator.index``
    fails: a float, a string; bool and NumPy integers pass), and OverflowError
    naming ``func`` and ``name`` when it lies outside [-2**63, 2**63 - 1].
    """
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {name} must be an integer, got {type(value).__name__}") from None
    if not -_INT64_MAX - 1 <= v <= _INT64_MAX:
        raise OverflowError(f"{func}: {name}={v} does not fit a 64-bit signed integer")
    return v
