"""The simulated IBM Spyre target: its native 16-bit format, DLFloat16 (df16).

df16 (Agrawal et al., "DLFloat: A 16-b Floating Point Format Designed for Deep
Learning Training and Inference", IEEE ARITH 2019; the NNP data type that IBM
zDNN and onnx-mlir convert to) has 1 sign bit, 6 exponent bits (bias 31) and 9
fraction bits. Every exponent 0..63 is normal, value (-1)^s * 2^(E-31) *
(1 + F/512); there are no subnormals. Low 15 bits all zero is ±0, all ones
(0x7FFF / 0xFFFF) is the single NaN/Inf code. Range: 0x0001 = 2^-31 * (1 + 2^-9)
to 0x7FFE = 8573157376.0. See docs/spyre_df16.md for the codec's choices.

df16 bits are held in ``torch.int16`` tensors (0xFFFF reads as -1).

Inspection of the Spyre target's work: :func:`dump_ktir` (tile programs),
:func:`last_schedule` / :func:`dump_schedule` (dataflow schedules) and
:func:`job_plan` / :func:`dump_job_plan` (the flush's job plan); see docs/spyre.md.
"""

import json

import torch

from . import _C

__all__ = [
    "DF16_NAN_INF",
    "DF16_MAX_FINITE_BITS",
    "DF16_MAX",
    "DF16_SMALLEST",
    "df16_encode",
    "df16_decode",
    "df16_round",
    "dump_ktir",
    "format_ktir",
    "verify_ktir",
    "run_ktir",
    "last_schedule",
    "dump_schedule",
    "job_plan",
    "dump_job_plan",
]

DF16_NAN_INF = 0x7FFF  #: the NaN/Inf code (with the sign bit: 0xFFFF)
DF16_MAX_FINITE_BITS = 0x7FFE  #: largest finite magnitude's code
DF16_MAX = 8573157376.0  #: 2**32 * (1 + 510/512), the largest finite df16 value
DF16_SMALLEST = 2.0**-31 * (1 + 2.0**-9)  #: smallest nonzero magnitude (code 0x0001)

_ROUNDINGS = ("nearest_away", "nearest_even")
_OVERFLOWS = ("nan_inf", "saturate")


def _check_option(name, value, allowed):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")


def _to_cpu(t, fn):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn} expects a torch.Tensor, got {type(t).__name__}")
    # Device tensors ("tpu") are read back to the host; this flushes their pending ops.
    return t.detach().to("cpu")


def _back(result, like):
    return result if like.device.type == "cpu" else result.to(like.device)


def df16_encode(x, rounding="nearest_away", overflow="nan_inf"):
    """Encodes a floating-point tensor to df16 bits.

    Args:
        x: tensor of any floating dtype (float16, bfloat16, float32, float64) and any
            shape or strides, on CPU or "tpu". float64 is first rounded to float32
            (Spyre converts from f32); float16 and bfloat16 widen to f32 exactly.
        rounding: ``"nearest_away"`` (default; round to nearest, ties away from zero,
            as the hardware does) or ``"nearest_even"`` (ties to even).
        overflow: ``"nan_inf"`` (default): magnitudes that round past the largest
            finite value, and ±Inf, become the NaN/Inf code 0x7FFF with the sign;
            ``"saturate"``: they become ±0x7FFE (±8573157376.0). NaN always becomes
            0x7FFF with its sign.

    Magnitudes that round below 2**-31 * (1 + 2**-9) become zero with the sign
    (rounding happens first: a value rounding up to the smallest code gets it).

    Returns:
        A contiguous ``torch.int16`` tensor of x's shape, on x's device, holding the
        df16 bit patterns.

    Raises:
        TypeError: x is not a tensor or not of a floating dtype.
        ValueError: unknown ``rounding`` or ``overflow``.
    """
    _check_option("rounding", rounding, _ROUNDINGS)
    _check_option("overflow", overflow, _OVERFLOWS)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"df16_encode expects a floating-point tensor, got {got}")
    bits = _C._df16_encode(_to_cpu(x, "df16_encode"), rounding == "nearest_even", overflow == "saturate")
    return _back(bits, x)


def df16_decode(bits):
    """Decodes df16 bits to float32 values (exact: every df16 value is an f32).

    Args:
        bits: ``torch.int16`` tensor of df16 codes, any shape, on CPU or "tpu".

    Returns:
        A contiguous ``torch.float32`` tensor of the same shape on the same device.
        ±0 codes give ±0.0; the NaN/Inf code (0x7FFF, 0xFFFF) gives NaN with the
        sign bit set accordingly (df16 cannot tell Inf from NaN; zDNN also decodes
        it to NaN).

    Raises:
        TypeError: bits is not an int16 tensor.
    """
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.int16:
        got = bits.dtype if isinstance(bits, torch.Tensor) else type(bits).__name__
        raise TypeError(f"df16_decode expects a torch.int16 tensor of df16 bits, got {got}")
    return _back(_C._df16_decode(_to_cpu(bits, "df16_decode")), bits)


def df16_round(x, rounding="nearest_away", overflow="nan_inf"):
    """Rounds x through df16 and back: ``df16_decode(df16_encode(x))`` in x's dtype.

    This is what a tensor holds after a trip through Spyre memory. The result has
    x's shape, dtype and device (contiguous). Casting back to a narrower dtype than
    float32 rounds once more with PyTorch's rules: float16 overflows to ±inf above
    65504 and flushes below its subnormal range; bfloat16 (8 fraction bits) rounds
    to nearest even.

    Args and errors: as :func:`df16_encode`.
    """
    return df16_decode(df16_encode(x, rounding, overflow)).to(x.dtype)


_DUMP_FORMATS = ("text",)


def dump_ktir(format="text"):
    """The KTIR-like tile programs of the last flush run on the Spyre target, as text.

    Pending ops are flushed first (so the program just recorded is included).
    Each region is one ``ktir.kernel`` block: the grid over the 32 cores (dim 0
    split into ``rows_per_core``), its memory views (``HBM`` for values in device
    memory, ``LX`` for region temporaries kept in the scratchpads; offset, sizes
    and strides in elements; device dtypes ``f32``, ``df16``, ``i32``), the
    access tile of each view per core and the op list. The format is described in
    docs/ktir.md. Blocks are separated by a blank line; ``""`` when the last
    flush ran no region on Spyre. Set the environment variable
    ``TORCH_TPU_DUMP_DIR`` to a directory to also write every region's program to
    its own file (``region_<n>_<name>.ktir``).

    Args:
        format: ``"text"`` (the only format).

    Raises:
        ValueError: an unknown ``format``.
    """
    _check_option("format", format, _DUMP_FORMATS)
    _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
    return "\n".join(_C._ktir_last())


def format_ktir(text):
    """Parses KTIR text (docs/ktir.md) and prints it back in canonical form.

    ``format_ktir(t) == t`` for every program :func:`dump_ktir` prints.

    Raises:
        ValueError: text that does not parse ("KTIR line N: rule 'syntax': ...").
    """
    return _C._ktir_format(text)


def verify_ktir(text):
    """Parses and verifies KTIR text against the active Spyre card's rules
    (docs/ktir.md: types, view bounds, tiles in whole sticks, LX capacity per
    core, grid, def-use of views, known ops).

    Raises:
        ValueError: the first rule broken, as "KTIR line N: rule '<rule>': ...".
    """
    _C._ktir_verify(text)


def run_ktir(path, *tensors):
    """Runs a KTIR kernel file (e.g. one written to ``TORCH_TPU_DUMP_DIR`` and
    edited) with Spyre's numerics: each op in float32 from its df16 inputs,
    its result rounded once to df16 and stored in the view's dtype.

    Args:
        path: a ``.ktir`` file holding one ``ktir.kernel``.
        *tensors: one tensor per ``in`` / ``inout`` argument (``%aK``) in order,
            of the argument's dtype with at least its ``elems`` elements
            (flattened; CPU or "tpu"). ``inout`` tensors are written in place
            when on CPU and contiguous.

    Returns:
        A tuple with one flat tensor per ``out`` / ``inout`` argument, in
        argument order, on the first tensor's device (CPU when none is given).

    Raises:
        ValueError: the file breaks a verifier rule (the message names the line
            and rule), or the tensors do not match the arguments.
    """
    with open(path) as f:
        text = f.read()
    device = tensors[0].device if tensors else torch.device("cpu")
    cpu = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"run_ktir expects tensors, got {type(t).__name__}")
        c = t.detach()
        cpu.append(c if c.device.type == "cpu" and c.is_contiguous() else c.to("cpu").contiguous())
    outs = _C._ktir_run(text, cpu)
    return tuple(o if device.type == "cpu" else o.to(device) for o in outs)


def last_schedule():
    """The dataflow schedules of the last flush run on the Spyre target, one dict per region.

    Pending ops are flushed first. Each region's schedule describes what one core
    (with a full share of rows) runs: a double-buffered load -> compute -> store
    pipeline over tiles (docs/spyre.md, "Dataflow schedule"). Keys:

    - ``kernel`` (region name), ``cores`` (32), ``cores_used``, ``corelets`` (2 per
      core), ``rows`` (the split dim's extent; 0 for a rank-0 anchor),
      ``rows_per_core``.
    - ``n_tiles`` (tiles per core), ``tile_rows`` (rows of a split view per tile; 0
      when rows are cut into sticks), ``row_split`` (one row of every view did not
      fit: tiles are whole 128-byte sticks of a row), ``corelet_split`` (``"rows"``
      or ``"sticks"``) and ``corelet_share`` (the first tile's rows or sticks per
      corelet).
    - ``buffers`` (2), ``lx_budget_bytes`` (``lx_usable_bytes_per_core``),
      ``lx_bytes_used`` (buffers x the tiles' bytes, <= the budget).
    - ``views``: per KTIR view ``%id``: ``space`` (``"HBM"``/``"LX"``), ``loaded``,
      ``stored``, ``split``, ``tile_sizes`` (elements), ``tile_sticks``,
      ``tile_bytes``.
    - ``load_bytes_per_tile``, ``store_bytes_per_tile`` (bytes).
    - ``ring_steps``, ``ring_bytes``, ``ring_cycles`` (at 128 B per cycle),
      ``partial_bytes`` (what one hop carries; the largest hop of an order
      statistic's selection, whose chains carry histograms, digits and
      counts: docs/ktir.md, "Selection"), ``ring_s`` (seconds:
      ``ring_steps * ring_hop_latency_s + ring_bytes / ring_link_bandwidth``, the
      link bandwidth and the hop latency (32 cycles) from an ASSUMED 1.5 GHz clock,
      see ``target_info("spyre")["sources"]``; the ring part of ``executed_s``
      depends on them too), ``ring_latency_s`` (seconds: the hops' latency part of
      ``ring_s``): the cross-core reduction over the ring of a region that reduces
      its split dim (all 0 otherwise).
    - Seconds: ``compute_s`` and ``memory_s`` (the region's C and M),
      ``tile_load_s``, ``tile_compute_s``, ``tile_store_s``, ``fill_s``,
      ``steady_s``, ``drain_s``, ``pipelined_s`` (fill + steady + drain + ring) and
      ``calibrated_s`` (C + M - 0.46 min(C, M), the region's reported time).
    - ``stages``: dicts ``kind`` (``"load"``, ``"compute"``, ``"store"``,
      ``"ring_reduce"``), ``tile``, ``buffer`` (0/1; -1 for the ring), ``bytes``,
      ``start_s``, ``end_s``, in start order, for tiles 0-2 and the last tile;
      ``stages_omitted`` counts the others. ``text``: the printed schedule.
    - How the interpreter ran the region (docs/ktir.md, "How the executor runs a
      program"): ``executed`` (``"tiles"``: step by step over the schedule's
      tiles of every core; ``"whole"``: every op once on whole views),
      ``whole_reason`` (why not tiles, e.g. ``"index.Tensor is not row-local"``;
      ``""`` when tiled), ``tile_steps``, ``ring_steps_run`` (hops along the
      ring: ``cores_used - 1`` per chain; a selection runs ``2 * D + 1``
      chains for keys of ``D`` bytes).
    - The executed schedule (docs/spyre.md, "The executed schedule"):
      ``executed_s`` (seconds: the latest core's pipeline end plus
      ``ring_s``; what
      ``metrics()["schedule_time_s"]`` sums) and ``per_core``: per core used,
      dicts ``core``, ``rows`` (rows of the split dim it processed), ``tiles``,
      ``load_s``, ``compute_s``, ``store_s`` (summed stage seconds), ``end_s``
      and ``overlap_s`` (load + compute + store - end).

    Returns ``[]`` when the last flush ran no region on Spyre.
    """
    _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
    return _C._schedule_last()


def dump_schedule(format="text"):
    """The dataflow schedules of the last flush as text (one block per region).

    Args:
        format: ``"text"`` (the only format; :func:`last_schedule` gives dicts).

    Raises:
        ValueError: an unknown ``format``.
    """
    _check_option("format", format, _DUMP_FORMATS)
    return "\n".join(s["text"] for s in last_schedule())


def job_plan():
    """The job plan of the last flush run on the Spyre target, as a dict.

    A SpyreCode-like manifest (docs/spyre.md, "Job plan"): ``args``, the flush's
    symbolic tensor arguments (``symbol`` ``"%arg<k>"``, device ``dtype``,
    ``numel``, ``sizes`` of the first view, ``stick_elems``, ``sticks``, ``bytes``
    (whole 128-byte sticks) and ``address``, the simulated device address it was
    patched to at launch); ``steps`` in order: ``{"kind": "H2D", "arg", "bytes"}``,
    ``{"kind": "Compute", "kernel", "region", "reads", "writes", "binding",
    "program", "programs"}`` (``region`` indexes :func:`dump_ktir` blocks and
    :func:`last_schedule`; ``binding`` the launch's values of the program's
    symbols; ``program`` which of the kernel's compiled programs it bound,
    numbered from 0 in order of compiling, of ``programs`` it holds),
    ``{"kind": "D2H", "arg", "bytes"}``; ``device_bytes`` (sum of the arguments'
    bytes). Pending ops are flushed first. Empty lists when the last flush ran no
    region on Spyre.
    """
    _C._flush(_C.FLUSH_SYNCHRONIZE, raise_error=False)
    return _C._job_plan_last()


_PLAN_FORMATS = ("json",)


def dump_job_plan(path, format="json", indent=2):
    """Writes :func:`job_plan` to ``path`` as JSON and returns the plan.

    Args:
        path: file path (str or os.PathLike).
        format: ``"json"`` (the only format).
        indent: JSON indentation, a non-negative int or None.

    Raises:
        ValueError: an unknown ``format`` or a bad ``indent``.
        TypeError: ``path`` is not a path.
    """
    _check_option("format", format, _PLAN_FORMATS)
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int) or indent < 0):
        raise ValueError(f"indent must be a non-negative int or None; got {indent!r}")
    import os

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"dump_job_plan expects a path, got {type(path).__name__}")
    plan = job_plan()
    with open(path, "w") as f:
        json.dump(plan, f, indent=indent)
    return plan
