"""Simulated targets: which chip the "tpu" device models.

Each chip is one data file, ``torch_tpu_eager/targets/<name>.json``, holding every
number with its unit and its source (``params``), and the interconnect facts that are
not a number (topology, largest slice shape, wraparound rule) likewise (``interconnect``).
The active target sets the cost model of the
executor (peak FLOP/s, HBM bandwidth, MXU size, ...) and the HBM capacity that
allocations are checked against. Choose it with :func:`set_target` or, before
import, the environment variable ``TORCH_TPU_TARGET`` (default ``"tpu-v5e"``).
"""

import functools
import json
import os

from . import _C

ENV_VAR = "TORCH_TPU_TARGET"
_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets")

# Parameters a "tpu" data file must give (see targets/tpu-v5e.json).
_TPU_PARAMS = (
    "tensor_cores",  # TensorCores per chip
    "mxus_per_core",  # MXUs per TensorCore
    "mxu_size",  # an MXU is mxu_size x mxu_size
    "sublanes",  # vector register rows
    "lanes",  # vector register lanes
    "peak_bf16_flops",  # FLOP/s per chip
    "hbm_bandwidth",  # bytes/s
    "hbm_bytes",  # bytes
    "vmem_bytes",  # bytes per TensorCore
    "launch_s",  # seconds per kernel
)

# Interconnect (ICI) numbers a "tpu" data file must give in ``params``, and facts in
# its ``interconnect`` section; the collective cost model (torch_tpu_eager.ici) reads
# them, the executor does not.
_ICI_PARAMS = (
    "ici_link_bandwidth",  # bytes/s per link per direction
    "ici_links",  # links (ports) per chip
    "ici_hop_latency_s",  # seconds per hop
)
_ICI_FACTS = (
    "ici_topology",  # "2d_torus" or "3d_torus"
    "ici_max_slice_shape",  # chips per axis of the largest slice
    "ici_wraparound",  # when an axis has its wraparound link: {"rule": ..., "n": ...}
)

# Parameters a "spyre" data file must give (see targets/spyre.json).
_SPYRE_PARAMS = (
    "cores",
    "corelets_per_core",
    "lx_bytes_per_core",
    "lx_usable_bytes_per_core",
    "dram_bytes",
    "stick_bytes",
    "matmul_sustained_mac_per_ns_per_core",
    "vector_elems_per_us_per_core",
    "dram_bandwidth_mixed",
    "overlap_factor",
    "ring_bytes_per_cycle",
    "core_clock_hz",
)
_KINDS = {"tpu": _TPU_PARAMS + _ICI_PARAMS, "spyre": _SPYRE_PARAMS}


def _names():
    return sorted(f[:-5] for f in os.listdir(_DIR) if f.endswith(".json"))


@functools.lru_cache(maxsize=None)
def _load(name: str) -> dict:
    with open(os.path.join(_DIR, name + ".json")) as f:
        spec = json.load(f)
    if spec.get("name") != name:
        raise ValueError(f"targets/{name}.json names itself {spec.get('name')!r}")
    entries = {**spec["params"], **spec.get("interconnect", {})}
    for key, p in entries.items():
        if not isinstance(p, dict) or "value" not in p or not p.get("source"):
            raise ValueError(f"targets/{name}.json: parameter {key!r} needs a value and a source")
    if spec.get("kind") in _KINDS:
        missing = [k for k in _KINDS[spec["kind"]] if k not in spec["params"]]
        if spec["kind"] == "tpu":
            missing += [k for k in _ICI_FACTS if k not in spec.get("interconnect", {})]
        if missing:
            raise ValueError(f"targets/{name}.json lacks {missing}")
    return spec


def list_targets(include_placeholders: bool = False) -> list:
    """Names of the targets that :func:`set_target` accepts, e.g. ``["tpu-v4", "tpu-v5e", ...]``.

    With ``include_placeholders=True`` also data files of kinds no executor exists for.
    """
    return [n for n in _names() if include_placeholders or _load(n).get("kind") in _KINDS]


def _derived(values: dict) -> dict:
    # The VPU issues one operation per (sublane, lane) slot per cycle on each
    # TensorCore. No clock rate is published alongside the peak, so use the one
    # the peak implies: peak = 2 FLOP x MXU cells x MXUs x cores x clock.
    cells = values["mxu_size"] ** 2
    clock = values["peak_bf16_flops"] / (2 * cells * values["mxus_per_core"] * values["tensor_cores"])
    return {
        "clock_hz": clock,
        "vpu_elems_per_s": values["tensor_cores"] * values["sublanes"] * values["lanes"] * clock,
    }


def target_info(name: str | None = None) -> dict:
    """The numbers of target ``name`` (default: the active one) as a flat dict.

    Keys are the data file's parameters (units: bytes, bytes/s, FLOP/s, seconds;
    see ``sources``) and interconnect facts (``ici_topology``, ``ici_max_slice_shape``,
    ``ici_wraparound``; Spyre: ``card_interconnect``, None, and derived
    ``ring_link_bandwidth``, bytes/s per direction, and ``ring_hop_latency_s``, seconds per
    hop) plus derived ``clock_hz`` (clock implied by the bf16 peak) and
    ``vpu_elems_per_s`` (tensor_cores x sublanes x lanes x clock_hz), ``name``,
    ``kind``, ``description`` and ``sources`` (parameter -> source text).
    """
    name = get_target() if name is None else name
    _check_name(name, include_placeholders=True)
    spec = _load(name)
    values = {k: p["value"] for k, p in spec["params"].items()}
    info = {"name": name, "kind": spec["kind"], "description": spec.get("description", "")}
    info.update(values)
    sources = {k: p["source"] for k, p in spec["params"].items()}
    for k, p in spec.get("interconnect", {}).items():
        info[k] = p["value"]
        sources[k] = p["source"]
    if spec["kind"] == "spyre":
        info["ring_link_bandwidth"] = values["ring_bytes_per_cycle"] * values["core_clock_hz"]
        sources["ring_link_bandwidth"] = (
            "derived: ring_bytes_per_cycle x core_clock_hz (bytes/s per direction of one ring link; "
            "the clock is an assumption, see core_clock_hz)"
        )
        info["ring_hop_latency_s"] = values["ring_hop_latency_cycles"] / values["core_clock_hz"]
        sources["ring_hop_latency_s"] = (
            "derived: ring_hop_latency_cycles / core_clock_hz (seconds per ring hop apart from its bytes; "
            "both are assumptions, see their sources)"
        )
    if spec["kind"] == "tpu":
        info.update(_derived(values))
        sources["clock_hz"] = "derived: peak_bf16_flops / (2 * mxu_size**2 * mxus_per_core * tensor_cores)"
        sources["vpu_elems_per_s"] = "derived: tensor_cores * sublanes * lanes * clock_hz (one op per slot per cycle)"
    info["sources"] = sources
    return info


def _check_name(name, include_placeholders=False):
    valid = _names() if include_placeholders else list_targets()
    if not isinstance(name, str) or name not in valid:
        raise ValueError(f"unknown target {name!r}; valid targets: {', '.join(list_targets())}")


def _check_settable(name: str) -> None:
    """Raises what :func:`set_target` raises for ``name`` itself: ValueError for an unknown
    name, NotImplementedError for a data file of a kind no executor exists for."""
    if name in _names() and _load(name).get("kind") not in _KINDS:
        raise NotImplementedError(
            f"target {name!r} is not built yet ({_load(name).get('status', 'placeholder')}); "
            f"available targets: {', '.join(list_targets())}"
        )
    _check_name(name)


def set_target(name: str) -> None:
    """Makes ``name`` the simulated chip: one of :func:`list_targets`, e.g. ``"tpu-v6e"``.

    Pending ops are flushed first (flush reason ``"target_switch"``) so they run
    and are costed on the previous chip; compiled regions are dropped. An error
    of a pending op is not raised here: it stays with the tensors it poisoned,
    as for any automatic flush. Tensors already allocated stay; later
    allocations are checked against the new chip's HBM capacity.
    ``"spyre"`` selects the simulated IBM Spyre executor (df16 storage of
    16-bit floats, int64 held as int32, Spyre's cost model).
    Raises ValueError listing the valid names for an unknown name, and
    NotImplementedError for a data file of a kind no executor exists for.
    """
    _check_settable(name)
    info = target_info(name)
    if info["kind"] == "spyre":
        _C._set_spyre_target(
            {
                "name": name,
                "cores": int(info["cores"]),
                "corelets_per_core": int(info["corelets_per_core"]),
                "lx_bytes_per_core": int(info["lx_bytes_per_core"]),
                "lx_usable_bytes_per_core": int(info["lx_usable_bytes_per_core"]),
                "dram_bytes": int(info["dram_bytes"]),
                "stick_bytes": int(info["stick_bytes"]),
                "matmul_macs_per_s_per_core": info["matmul_sustained_mac_per_ns_per_core"] * 1e9,
                "vector_elems_per_s_per_core": info["vector_elems_per_us_per_core"] * 1e6,
                "dram_bandwidth": info["dram_bandwidth_mixed"],
                "overlap": info["overlap_factor"],
                "ring_link_bandwidth": info["ring_link_bandwidth"],
                "ring_hop_latency_s": info["ring_hop_latency_s"],
            }
        )
        return
    params = {k: info[k] for k in _TPU_PARAMS}
    params["hbm_bytes"] = int(params["hbm_bytes"])
    params["vmem_bytes"] = int(params["vmem_bytes"])
    params["vpu_elems_per_s"] = info["vpu_elems_per_s"]
    params["name"] = name
    _C._set_target(params)


def get_target() -> str:
    """Name of the active target, e.g. ``"tpu-v5e"``."""
    return _C._target_name()


def _init_from_env() -> None:
    name = _C._env_string(ENV_VAR)  # the knob registry's parse and default (torch_tpu_eager.env)
    try:
        _check_settable(name)
    except (ValueError, NotImplementedError) as e:
        raise type(e)(f"{ENV_VAR}={name!r}: {e}") from None
    set_target(name)  # its other errors (e.g. a malformed TORCH_TPU_NUM_DEVICES) name their own variable
