"""Count a sweep's records by suite: python report.py run/s*.jsonl [more passes ...]

A later file's record of a case replaces an earlier one's. Prints the markdown table,
bit-for-bit and f64-judged counts, the median largest relative difference of the inexact
matches, and every non-matching case that ran on both devices.
"""

import json
import statistics
import sys

COLS = [
    ("match", "match"),
    ("mismatch", "mismatch"),
    ("random_cpu", "random on CPU"),
    ("error", "error"),
    ("crash", "crash"),
    ("timeout", "timeout"),
    ("cpu_fail", "fails on CPU too"),
    ("skipped", "skipped (> 30M params)"),
]
SUITES = ["transformers", "timm", "torchvision"]


def load(paths):
    recs = {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            recs[(r["suite"], r["name"])] = r
    return recs


def main():
    recs = load(sys.argv[1:])
    print("| suite | cases | " + " | ".join(c[1] for c in COLS) + " |")
    print("|---|---:|" + "---:|" * len(COLS))
    tot = {c[0]: 0 for c in COLS}
    for s in SUITES + ["all"]:
        rs = [r for (su, _), r in recs.items() if s in (su, "all")]
        cnt = {c[0]: sum(r["status"] == c[0] for r in rs) for c in COLS}
        if s != "all":
            for k, v in cnt.items():
                tot[k] += v
        print(f"| {s} | {len(rs)} | " + " | ".join(str(cnt[c[0]]) for c in COLS) + " |")
    m = [r for r in recs.values() if r["status"] == "match"]
    bit = [r for r in m if r.get("bit")]
    f64 = [r for r in m if r.get("f64_judged")]
    inexact = [r["largest_rel"] for r in m if not r.get("bit") and not r.get("f64_judged")]
    print(
        f"\nmatch {len(m)}: bit for bit {len(bit)} "
        + str({s: sum(r["suite"] == s for r in bit) for s in SUITES})
        + f"; f64-judged {len(f64)} {[(r['suite'], r['name'], r['f64_judged']) for r in f64]}"
    )
    if inexact:
        print(
            f"largest relative difference of the other {len(inexact)}: median {statistics.median(inexact):.2g},"
            f" max {max(inexact):.2g}"
        )
    evals = [(r["suite"], r["name"]) for r in m if r.get("mode") == "eval"]
    print(f"compared in eval(): {evals}")
    loads = [r["load"] for r in recs.values() if "load" in r]
    if loads:
        print(f"load at the cases: {min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})")
    for r in recs.values():
        if r["status"] in ("mismatch", "error", "crash", "timeout", "random_cpu"):
            print(
                f"\n{r['status']}: {r['suite']} {r['name']} phase={r.get('phase', r.get('where'))} "
                f"nbad={r.get('nbad')} {r.get('bad', [])[:5]} {r.get('error', '')[:300]}"
            )
    if "-v" in sys.argv or True:
        fails = sorted(
            (r["suite"], r["name"], r.get("error", "")[:120]) for r in recs.values() if r["status"] == "cpu_fail"
        )
        print(f"\nfails on CPU too ({len(fails)}):")
        for f in fails:
            print("  ", *f)


if __name__ == "__main__":
    main()
