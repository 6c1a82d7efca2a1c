"""ATen coverage report of the "tpu" device: registered kernels and an OpInfo sweep.

Run as::

    python -m torch_tpu_eager.coverage [--target tpu-v5e|spyre] [--ops add,mul,sum]
        [--dtypes float32,bfloat16,int64] [--noncontiguous] --out coverage.md --json coverage.json

Two parts:

- **Registration**, counted by the dispatcher: the aten overloads with their own
  PrivateUse1 kernel (``torch._C._dispatch_has_kernel_for_dispatch_key``; the boxed
  fallback is not a kernel of the op, so it does not count), their distinct op names,
  and how many are lowered to the JIT's primitive IR (op-table kinds in
  :data:`LOWERED_KINDS`) versus library calls, sync ops and views.
- **Sweep**: every OpInfo of ``op_db`` that reaches a registered overload
  (:func:`torch_tpu_eager.testing.coverage`) is run sample by sample on CPU and on "tpu"
  (:func:`torch_tpu_eager.testing.sweep_op`) for each requested dtype.

The Markdown report has a header (date, torch version, target, counts, comparison with
TorchTPU), per-dtype totals, failure groups, one row per (OpInfo, dtype) and the
uncovered OpInfos; the JSON file holds the same data plus every overload and failure.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import faulthandler
import json
import os
import re
import subprocess
import sys
import time
import warnings
from typing import Optional

import torch

import torch_tpu_eager

# Op-table kinds that the JIT lowers to its primitive IR (fusible). The other kinds
# ("library": the CPU kernel on host buffers; "sync": a library call whose output shape
# depends on data, so it flushes; "view": metadata only) are not lowered.
LOWERED_KINDS = frozenset({"elementwise", "reduction", "matmul", "data", "random"})
# Kind given to overloads with a PrivateUse1 kernel that are not rows of op_table():
# the device runtime (allocation, copies, set_/resize_, view/as_strided metadata).
RUNTIME_KIND = "runtime"
# Kinds that do no computation; an OpInfo that reaches only these is classified "view".
_NEUTRAL_KINDS = frozenset({"view", RUNTIME_KIND})

# Google's TorchTPU, as stated in issue 3 (not measured here): overloads registered with
# their own kernels and their distinct op names.
TORCHTPU_OVERLOADS = 674
TORCHTPU_NAMES = 483

_COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
_STATUSES = ("pass", "fail", "error", "skip")


def _op_name(overload: str) -> str:
    """``add.Tensor`` -> ``add``; ``abs`` -> ``abs``."""
    return overload.split(".", 1)[0]


def registration() -> dict:
    """Counts of the aten overloads that "tpu" has its own PrivateUse1 kernel for.

    Returns a dict: ``overloads`` (sorted names in op_table() format, ``add.Tensor``),
    ``kinds`` (overload -> op-table kind, or ``"runtime"`` for kernels outside the op
    table), ``by_kind`` (kind -> overload count), ``names`` (distinct op names),
    ``lowered_overloads`` / ``lowered_names`` (kinds in :data:`LOWERED_KINDS`), and
    ``cpu_parity``: the aten overloads with a CPU kernel and no composite kernel (the
    set needed for CPU parity), how many of them "tpu" registers, and the missing ones.
    """
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    table = dict(torch_tpu_eager.op_table())
    aten = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    overloads = sorted(n[len("aten::") :] for n in aten if has(n, "PrivateUse1"))
    kinds = {o: table.get(o, RUNTIME_KIND) for o in overloads}
    by_kind = collections.Counter(kinds.values())
    lowered = [o for o in overloads if kinds[o] in LOWERED_KINDS]
    parity = sorted(n[len("aten::") :] for n in aten if has(n, "CPU") and not any(has(n, k) for k in _COMPOSITE_KEYS))
    registered = set(overloads)
    return {
        "overloads": overloads,
        "kinds": kinds,
        "by_kind": dict(sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0]))),
        "names": sorted({_op_name(o) for o in overloads}),
        "lowered_overloads": len(lowered),
        "lowered_names": len({_op_name(o) for o in lowered}),
        "op_table_rows": len(table),
        "op_table_unregistered": sorted(set(table) - registered),
        "cpu_parity": {
            "overloads": len(parity),
            "registered": sum(o in registered for o in parity),
            "missing": [o for o in parity if o not in registered],
        },
    }


def lowering_of(registered_reached, kinds: dict) -> str:
    """How an OpInfo's registered overloads run: "lowered", "library", "mixed k/n" or "view".

    Views and runtime kernels (allocation, copies) are left out of the count; an OpInfo
    that reaches nothing else is "view".
    """
    compute = [o for o in registered_reached if kinds.get(o, RUNTIME_KIND) not in _NEUTRAL_KINDS]
    if not compute:
        return "view"
    n_low = sum(kinds[o] in LOWERED_KINDS for o in compute)
    if n_low == len(compute):
        return "lowered"
    if n_low == 0:
        return "library"
    return f"mixed {n_low}/{len(compute)}"


def status_of(res) -> str:
    """pass / fail / error / skip of one OpResult (an error outranks a value mismatch)."""
    if res.skip_reason or res.total == 0:
        return "skip"
    if res.errors:
        return "error"
    if res.failed:
        return "fail"
    return "pass"


def _reason(res, status: str) -> Optional[str]:
    """First failure of the kind that gave the status, or why the case was skipped."""
    if status == "skip":
        if res.skip_reason:
            return res.skip_reason
        return "every sample skipped: " + "; ".join(f"{k} ({v})" for k, v in res.skipped_why.items())
    if status == "pass":
        return None
    kind = "error" if status == "error" else "fail"
    for idx, k, msg, _desc in res.failures:
        if k == kind:
            return f"sample {idx}: {msg}"
    idx, _k, msg, _desc = res.failures[0]
    return f"sample {idx}: {msg}"


def failure_group(message: str) -> str:
    """A failure message reduced to a grouping key: first line, numbers masked."""
    line = message.split(": ", 1)[1] if message.startswith("sample ") else message
    line = line.strip().splitlines()[0] if line.strip() else ""
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", line)
    return line[:140]


def _git_commit() -> Optional[str]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _fmt_s(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _Progress:
    """Plain-text progress on stderr: a line every ``every`` ops or ``interval`` seconds."""

    def __init__(self, total: int, enabled: bool, every: int = 10, interval: float = 30.0):
        self.total, self.enabled, self.every, self.interval = total, enabled, every, interval
        self.start = self.last = time.perf_counter()
        self.done = 0

    def step(self, name: str) -> None:
        self.done += 1
        now = time.perf_counter()
        if not self.enabled:
            return
        if self.done % self.every and self.done != self.total and now - self.last < self.interval:
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done)
        bar = "#" * int(20 * self.done / self.total)
        print(
            f"[{bar:<20}] {self.done}/{self.total} ops, {_fmt_s(elapsed)} elapsed, eta {_fmt_s(eta)} (last: {name})",
            file=sys.stderr,
            flush=True,
        )


def _parse_dtypes(text: str) -> list:
    dtypes = []
    for name in filter(None, (s.strip() for s in text.split(","))):
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")
        dtypes.append(dt)
    if not dtypes:
        raise ValueError("no dtype given")
    return dtypes


def _select_ops(op_db: list, names: Optional[list]) -> list:
    """OpInfos named in ``names`` (by name, or name.variant), else all of op_db."""
    from torch_tpu_eager.testing import op_key

    if not names:
        return list(op_db)
    wanted = set(names)
    chosen = [op for op in op_db if op.name in wanted or op_key(op) in wanted]
    found = {op.name for op in chosen} | {op_key(op) for op in chosen}
    unknown = sorted(wanted - found)
    if unknown:
        raise ValueError(f"no OpInfo named {', '.join(unknown)}")
    return chosen


def run(
    ops: Optional[list] = None,
    dtypes=(torch.float32,),
    *,
    noncontiguous: bool = False,
    max_numel: int = 1_000_000,
    max_samples: Optional[int] = None,
    progress: bool = True,
) -> dict:
    """Counts the registration and sweeps OpInfos; returns the report data (JSON-ready).

    ``ops``: OpInfo names (``name`` or ``name.variant``; all of op_db when None).
    Each covered OpInfo is swept for every dtype in ``dtypes`` (also the non-contiguous
    variant when ``noncontiguous``). Raises ValueError for an unknown OpInfo name.
    """
    from torch_tpu_eager.testing import coverage, load_op_db, op_key, sweep_op

    t0 = time.perf_counter()
    reg = registration()
    kinds = reg["kinds"]
    op_db = load_op_db()
    selected = _select_ops(op_db, ops)

    covered: list = []
    uncovered: list = []
    for op in selected:
        cov = coverage(op)
        (covered if cov.covered else uncovered).append((op, cov))
    t_cov = time.perf_counter() - t0

    layouts = [False, True] if noncontiguous else [False]
    bar = _Progress(len(covered), progress)
    results = []
    for op, cov in covered:
        lowering = lowering_of(cov.registered, kinds)
        overloads = {o: kinds.get(o, RUNTIME_KIND) for o in sorted(cov.registered)}
        for dtype in dtypes:
            for nc in layouts:
                res = sweep_op(op, dtype, "tpu", noncontiguous=nc, max_numel=max_numel, max_samples=max_samples)
                status = status_of(res)
                results.append(
                    {
                        "op": op_key(op),
                        "dtype": res.dtype,
                        "noncontiguous": nc,
                        "status": status,
                        "passed": res.passed,
                        "failed": res.failed,
                        "errors": res.errors,
                        "total": res.total,
                        "skipped": res.skipped,
                        "skipped_why": dict(res.skipped_why),
                        "skip_reason": res.skip_reason,
                        "reason": _reason(res, status),
                        "failures": [
                            {"sample": i, "kind": k, "message": m, "sample_desc": d} for i, k, m, d in res.failures
                        ],
                        "seconds": round(res.seconds, 4),
                        "lowering": lowering,
                        "overloads": overloads,
                        "unregistered_reached": sorted(cov.unregistered),
                    }
                )
        bar.step(op_key(op))

    return {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "commit": _git_commit(),
            "target": torch_tpu_eager.get_target(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "dtypes": [str(d).replace("torch.", "") for d in dtypes],
            "noncontiguous": noncontiguous,
            "ops_requested": list(ops) if ops else None,
            "max_numel": max_numel,
            "max_samples": max_samples,
            "seconds_coverage": round(t_cov, 2),
            "seconds_total": round(time.perf_counter() - t0, 2),
        },
        "registration": {
            "overloads": len(reg["overloads"]),
            "names": len(reg["names"]),
            "lowered_overloads": reg["lowered_overloads"],
            "lowered_names": reg["lowered_names"],
            "by_kind": reg["by_kind"],
            "op_table_rows": reg["op_table_rows"],
            "op_table_unregistered": reg["op_table_unregistered"],
            "cpu_parity": reg["cpu_parity"],
            "torchtpu": {"overloads": TORCHTPU_OVERLOADS, "names": TORCHTPU_NAMES},
            "overload_kinds": reg["kinds"],
        },
        "opinfos": {
            "op_db": len(op_db),
            "selected": len(selected),
            "covered": len(covered),
            "uncovered": [
                {"op": op_key(op), "reached": sorted(cov.reached), "error": cov.error} for op, cov in uncovered
            ],
        },
        "totals": totals(results),
        "failure_groups": failure_groups(results),
        "results": results,
    }


def _case(r: dict) -> str:
    return r["dtype"] + ("-noncontig" if r["noncontiguous"] else "")


def totals(results: list) -> dict:
    """Per case (dtype, or dtype-noncontig): status counts of the OpInfos and sample counts.

    ``pass_rate`` is samples passed / samples run (skipped samples are not run);
    ``op_pass_rate`` is OpInfos passing / OpInfos not skipped (one OpInfo with many
    failing samples weighs on the first, not on the second).
    """
    out: dict = {}
    for r in results:
        t = out.setdefault(
            _case(r),
            {
                "ops": 0,
                **{s: 0 for s in _STATUSES},
                "samples_passed": 0,
                "samples_failed": 0,
                "samples_errors": 0,
                "samples_run": 0,
                "samples_skipped": 0,
                "seconds": 0.0,
            },
        )
        t["ops"] += 1
        t[r["status"]] += 1
        t["samples_passed"] += r["passed"]
        t["samples_failed"] += r["failed"]
        t["samples_errors"] += r["errors"]
        t["samples_run"] += r["total"]
        t["samples_skipped"] += r["skipped"]
        t["seconds"] += r["seconds"]
    for t in out.values():
        t["seconds"] = round(t["seconds"], 2)
        t["pass_rate"] = t["samples_passed"] / t["samples_run"] if t["samples_run"] else None
        run_ops = t["ops"] - t["skip"]
        t["op_pass_rate"] = t["pass"] / run_ops if run_ops else None
    return out


def failure_groups(results: list) -> list:
    """Failing/erroring cases grouped by their first failure reason (numbers masked),
    largest group first: [{"reason", "cases", "samples", "ops"}]."""
    groups: dict = {}
    for r in results:
        if r["status"] not in ("fail", "error"):
            continue
        key = f"{r['status']}: {failure_group(r['reason'])}"
        g = groups.setdefault(key, {"reason": key, "cases": 0, "samples": 0, "ops": []})
        g["cases"] += 1
        g["samples"] += r["failed"] + r["errors"]
        g["ops"].append(f"{r['op']} ({_case(r)})")
    return sorted(groups.values(), key=lambda g: (-g["cases"], -g["samples"], g["reason"]))


def _md_cell(text: Optional[str], limit: int = 220) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[:limit] + " ..."
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def render_markdown(data: dict) -> str:
    """The Markdown report of :func:`run`'s data."""
    m, reg, infos, tot = data["meta"], data["registration"], data["opinfos"], data["totals"]
    kinds = reg["by_kind"]
    par = reg["cpu_parity"]
    non_lowered = ", ".join(f"{kinds[k]} {k}" for k in kinds if k not in LOWERED_KINDS)
    lowered_detail = ", ".join(f"{kinds[k]} {k}" for k in kinds if k in LOWERED_KINDS)
    ov_vs = reg["overloads"] - TORCHTPU_OVERLOADS
    nm_vs = reg["names"] - TORCHTPU_NAMES
    L = []
    L.append('# ATen coverage of the "tpu" device')
    L.append("")
    L.append(f"- **Date**: {m['date']}")
    L.append(
        f"- **torch**: {m['torch']} (Python {m['python']})"
        + (f"; torch_tpu_eager commit {m['commit']}" if m["commit"] else "")
    )
    L.append(f"- **Target**: {m['target']}; float32 matmul precision `{m['float32_matmul_precision']}`")
    ops_txt = ", ".join(m["ops_requested"]) if m["ops_requested"] else "all of op_db"
    L.append(
        f"- **Sweep**: dtypes {', '.join(m['dtypes'])}"
        + (" (contiguous and non-contiguous)" if m["noncontiguous"] else "")
        + f"; OpInfos: {ops_txt}; samples over {m['max_numel']} elements skipped"
        + (f"; at most {m['max_samples']} samples per case" if m["max_samples"] else "")
        + f"; run time {_fmt_s(m['seconds_total'])}"
    )
    L.append(f"- **Command**: `python -m torch_tpu_eager.coverage {_cli_args(m)}`")
    L.append("")
    L.append("## Registered kernels (counted by the dispatcher)")
    L.append("")
    L.append(
        f"- **Registered ATen overloads**: {reg['overloads']} ({reg['names']} distinct op names) "
        "with their own PrivateUse1 kernel; the boxed fallback is not counted."
    )
    L.append(
        f"- **Lowered to primitive IR**: {reg['lowered_overloads']} overloads "
        f"({reg['lowered_names']} names): {lowered_detail}."
    )
    L.append(
        f"- **Not lowered**: {reg['overloads'] - reg['lowered_overloads']} overloads: {non_lowered} "
        "(library = CPU kernel on host buffers; sync = library call whose output shape depends "
        "on data; runtime = allocation, copies and view metadata outside the op table)."
    )
    L.append(
        f'- **TorchTPU**: 674 ATen overloads / 483 names with their own kernels; "tpu" registers '
        f"{reg['overloads']} / {reg['names']} ({ov_vs:+d} overloads, {nm_vs:+d} names)."
    )
    L.append(
        f"- **CPU parity set** (aten overloads with a CPU kernel and no composite kernel on "
        f'torch {m["torch"]}): {par["overloads"]}; "tpu" registers {par["registered"]} of them, '
        f"{len(par['missing'])} missing (listed at the end)."
    )
    L.append("")
    L.append("## Sweep totals")
    L.append("")
    L.append(
        f"OpInfos in op_db: {infos['op_db']}; selected: {infos['selected']}; covered (reach a "
        f"registered overload): {infos['covered']}; uncovered: {len(infos['uncovered'])}."
    )
    L.append("")
    L.append(
        "| case | OpInfos | pass | fail | error | skip | samples passed / run | "
        "**sample pass rate** | OpInfo pass rate | samples skipped | time |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for case, t in tot.items():
        L.append(
            f"| {case} | {t['ops']} | {t['pass']} | {t['fail']} | {t['error']} | {t['skip']} | "
            f"{t['samples_passed']} / {t['samples_run']} | **{_pct(t['pass_rate'])}** | {_pct(t['op_pass_rate'])} | "
            f"{t['samples_skipped']} | {_fmt_s(t['seconds'])} |"
        )
    L.append("")
    L.append(
        "Status: *pass* every sample run matched CPU; *fail* a result (value, dtype, shape, "
        'exception type) differs from CPU; *error* "tpu" raised where CPU did not; *skip* no '
        "sample could be compared (random outputs, uninitialized memory, dtype unsupported)."
    )
    L.append("")
    groups = data["failure_groups"]
    L.append("## Failure groups")
    L.append("")
    if not groups:
        L.append("No failures.")
    else:
        L.append("| cases | samples | reason | OpInfos |")
        L.append("|---|---|---|---|")
        for g in groups:
            L.append(
                f"| {g['cases']} | {g['samples']} | {_md_cell(g['reason'], 160)} | "
                f"{_md_cell(', '.join(g['ops']), 400)} |"
            )
    L.append("")
    L.append("## Per OpInfo")
    L.append("")
    L.append(
        "Lowering: how the registered overloads the OpInfo reaches run (`lowered`: all lowered "
        "to primitive IR; `library`: none; `mixed k/n`: k of n; `view`: views/allocation only)."
    )
    L.append("")
    L.append(
        "| OpInfo | dtype | status | passed / total | skipped | lowering | time (s) | first failure / skip reason |"
    )
    L.append("|---|---|---|---|---|---|---|---|")
    for r in data["results"]:
        L.append(
            f"| {_md_cell(r['op'])} | {_case(r)} | {r['status']} | {r['passed']} / {r['total']} | "
            f"{r['skipped']} | {r['lowering']} | {r['seconds']:.2f} | {_md_cell(r['reason'])} |"
        )
    L.append("")
    failing = [r for r in data["results"] if r["status"] in ("fail", "error")]
    if failing:
        L.append("## Failures in full")
        L.append("")
        for r in failing:
            L.append(f"### {r['op']} ({_case(r)}): {r['failed']} failed, {r['errors']} errors of {r['total']}")
            L.append("")
            for f in r["failures"]:
                L.append(f"- sample {f['sample']} ({f['kind']}): {_md_cell(f['message'], 600)}  ")
                L.append(f"  sample: `{_md_cell(f['sample_desc'], 300).replace('`', '')}`")
            L.append("")
    if infos["uncovered"]:
        L.append("## Uncovered OpInfos")
        L.append("")
        L.append(
            "These reach no registered overload (composite ops that decompose into ops the "
            "device lacks, or ops with no kernel at all), so they are not swept."
        )
        L.append("")
        L.append(", ".join(u["op"] for u in infos["uncovered"]))
        L.append("")
    if par["missing"]:
        L.append('## CPU-parity overloads without a "tpu" kernel')
        L.append("")
        L.append(", ".join(par["missing"]))
        L.append("")
    return "\n".join(L)


def _cli_args(m: dict) -> str:
    parts = [f"--target {m['target']}", f"--dtypes {','.join(m['dtypes'])}"]
    if m["ops_requested"]:
        parts.append(f"--ops {','.join(m['ops_requested'])}")
    if m["noncontiguous"]:
        parts.append("--noncontiguous")
    if m["max_samples"]:
        parts.append(f"--max-samples {m['max_samples']}")
    return " ".join(parts)


# OpInfos swept when TORCH_TPU_QUICK=1 and --ops is not given (2 samples each).
QUICK_OPS = ("add", "mul", "sum", "softmax", "matmul", "index_select", "where", "cumsum")


def main(argv: Optional[list] = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 2 bad arguments/target)."""
    p = argparse.ArgumentParser(prog="python -m torch_tpu_eager.coverage", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--target",
        help="simulated chip (torch_tpu_eager.list_targets(); 'spyre' when built); default: the active target",
    )
    p.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant); default: all of op_db")
    p.add_argument("--dtypes", default="float32", help="comma-separated dtypes (default float32)")
    p.add_argument("--noncontiguous", action="store_true", help="also sweep non-contiguous samples")
    p.add_argument(
        "--precision",
        default="highest",
        choices=("highest", "high", "medium"),
        help="torch.set_float32_matmul_precision for the run (default highest)",
    )
    p.add_argument("--max-numel", type=int, default=1_000_000, help="skip samples with more tensor elements")
    p.add_argument("--max-samples", type=int, default=None, help="run at most this many samples per case")
    p.add_argument("--out", default="coverage.md", help="Markdown report path")
    p.add_argument("--json", default=None, help="JSON report path")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    if torch_tpu_eager._C._env_bool("TORCH_TPU_QUICK"):  # the short form the docs-command test runs
        args.ops = args.ops or ",".join(QUICK_OPS)
        args.max_samples = args.max_samples or 2

    # A crash in a kernel should name the op being swept rather than die silently.
    faulthandler.enable(file=sys.stderr)
    try:
        dtypes = _parse_dtypes(args.dtypes)
    except ValueError as e:
        p.error(str(e))
    if args.target:
        try:
            torch_tpu_eager.set_target(args.target)
        except NotImplementedError as e:
            print(f"coverage: target {args.target!r} cannot be swept yet: {e}", file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"coverage: {e}", file=sys.stderr)
            return 2
    torch.set_float32_matmul_precision(args.precision)
    ops = [s.strip() for s in args.ops.split(",") if s.strip()] if args.ops else None

    # OpInfo samples warn a lot (deprecations, degenerate reductions); keep stderr for progress.
    warnings.filterwarnings("ignore")
    try:
        data = run(
            ops,
            dtypes,
            noncontiguous=args.noncontiguous,
            max_numel=args.max_numel,
            max_samples=args.max_samples,
            progress=not args.quiet,
        )
    except ValueError as e:
        print(f"coverage: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w") as f:
        f.write(render_markdown(data))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    reg = data["registration"]
    summary = "; ".join(
        f"{case} {_pct(t['pass_rate'])} of {t['samples_run']} samples" for case, t in data["totals"].items()
    )
    print(
        f"coverage: {reg['overloads']} overloads / {reg['names']} names registered, "
        f"{reg['lowered_overloads']} lowered; {summary}; {_fmt_s(data['meta']['seconds_total'])}; "
        f"wrote {args.out}" + (f" and {args.json}" if args.json else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
