"""The on-disk cache (TORCH_TPU_CACHE_DIR / torch_tpu_eager.set_cache_dir).

Each scenario runs the same small program (an elementwise chain, softmax, a
matmul and one training step of a tiny MLP) in fresh processes sharing a
cache directory, and checks the counters of metrics() and the results (against
CPU PyTorch, and bitwise between processes: the cache must not change numerics).

What a warm process must report, given the cold one's counters: every entry
the cold process appended is found on disk (disk_cache_hits == cold
disk_cache_writes), nothing is compiled or appended, and the only disk misses
left are the lookups the cold process could not store either (calls whose meta
kernel rejected them run eagerly and are never cached).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from difftest import REPO_ROOT, requires_tpu

pytestmark = requires_tpu

ROOT = REPO_ROOT

PROGRAM = r"""
import json, sys
import torch
import torch.nn.functional as F
import torch_tpu_eager

def program(dev, x, w, xb, yb, params):
    x, w, xb, yb = x.to(dev), w.to(dev), xb.to(dev), yb.to(dev)
    chain = ((x * 2 + 1).sin() * x - 0.5).exp().clamp(max=5.0).tanh()
    soft = torch.softmax(x, dim=-1)
    mm = x @ w
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v.to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    outs = [chain, soft, mm, loss.detach()] + [p.detach() for p in model.parameters()]
    return [o.cpu() for o in outs]

torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
x = torch.randn(8, 16, generator=g)
w = torch.randn(16, 12, generator=g)
xb = torch.randn(32, 16, generator=g)
yb = torch.randint(0, 4, (32,), generator=g)
ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
params = [p.detach().clone() for p in ref.parameters()]
cpu = program("cpu", x, w, xb, yb, params)
torch_tpu_eager.reset_metrics()
tpu = program("tpu", x, w, xb, yb, params)
m = torch_tpu_eager.metrics()
print(json.dumps({
    "metrics": {k: m[k] for k in ("compiles", "cache_hits", "disk_cache_hits", "disk_cache_misses",
                                  "disk_cache_writes")},
    "cpu": [t.tolist() for t in cpu],
    "tpu": [t.tolist() for t in tpu],
    "tpu_hex": [[float(v).hex() for v in t.flatten().tolist()] for t in tpu],
    "stamp": torch_tpu_eager.disk_cache.cache_stamp(),
    "cache_dir": torch_tpu_eager.cache_dir(),
}))
"""


def child_env(cache_dir):
    """The environment of a child process that imports this checkout, with
    TORCH_TPU_CACHE_DIR set to `cache_dir` (unset when None)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TORCH_TPU_CACHE_DIR", None)
    if cache_dir is not None:
        env["TORCH_TPU_CACHE_DIR"] = str(cache_dir)
    return env


def run_program(tmp_path, cache_dir):
    """Runs PROGRAM in a fresh process; returns (parsed output, stderr)."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = child_env(cache_dir)
    out = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    # Results match CPU PyTorch whatever the cache did.
    for c, t in zip(res["cpu"], res["tpu"]):
        torch.testing.assert_close(torch.tensor(t), torch.tensor(c), rtol=1e-5, atol=1e-5)
    return res, out.stderr


def stamp_dir(cache, res):
    return cache / res["stamp"]


@pytest.fixture(scope="module")
def cold_run(tmp_path_factory):
    """One cold process's (cache dir, parsed output, stderr): PROGRAM run once with an
    empty cache dir. Every test that starts from a cold cache takes a copy of that dir
    (``cold_cache``) instead of running the same cold process again."""
    path = tmp_path_factory.mktemp("cold")
    res, err = run_program(path, path / "cache")
    return path / "cache", res, err


def cold_cache(cold_run, tmp_path):
    """A copy of the cold process's cache dir under ``tmp_path``; returns (dir, parsed
    output of the cold process)."""
    cache = tmp_path / "cache"
    shutil.copytree(cold_run[0], cache)
    return cache, cold_run[1]


def test_warm_process_loads_everything_from_disk(tmp_path, cold_run):
    cache, cold = cold_cache(cold_run, tmp_path)
    err = cold_run[2]
    mc = cold["metrics"]
    assert mc["compiles"] > 0 and mc["disk_cache_writes"] > 0
    assert mc["disk_cache_hits"] == 0
    assert mc["disk_cache_misses"] >= mc["disk_cache_writes"]
    assert "disk cache" not in err
    files = sorted(p.name for p in stamp_dir(cache, cold).iterdir())
    assert files == ["meta.bin", "regions.bin"]

    warm, err = run_program(tmp_path, cache)
    mw = warm["metrics"]
    assert mw["compiles"] == 0
    assert mw["disk_cache_hits"] == mc["disk_cache_writes"]
    assert mw["disk_cache_writes"] == 0
    assert mw["disk_cache_misses"] == mc["disk_cache_misses"] - mc["disk_cache_writes"]
    assert "disk cache" not in err
    assert warm["tpu_hex"] == cold["tpu_hex"]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_file_warns_and_keeps_its_valid_prefix(tmp_path, cold_run, damage):
    cache, cold = cold_cache(cold_run, tmp_path)
    writes = cold["metrics"]["disk_cache_writes"]
    meta = stamp_dir(cache, cold) / "meta.bin"
    data = bytearray(meta.read_bytes())
    cut = len(data) // 2
    if damage == "flip":
        data[cut : cut + 8] = bytes(b ^ 0xFF for b in data[cut : cut + 8])
    else:
        data = data[:cut]
    meta.write_bytes(bytes(data))

    second, err = run_program(tmp_path, cache)
    assert err.count("is corrupt or truncated") == 1
    m2 = second["metrics"]
    assert 0 < m2["disk_cache_hits"] < writes  # the valid prefix (and regions.bin) still serve
    assert m2["disk_cache_writes"] == writes - m2["disk_cache_hits"]
    assert second["tpu_hex"] == cold["tpu_hex"]

    # The damaged file was rewritten to its valid prefix, then completed.
    third, err = run_program(tmp_path, cache)
    assert "disk cache" not in err
    assert third["metrics"]["disk_cache_hits"] == writes and third["metrics"]["compiles"] == 0


def test_other_version_stamp_is_never_read(tmp_path, cold_run):
    cache, cold = cold_cache(cold_run, tmp_path)
    writes = cold["metrics"]["disk_cache_writes"]
    # Another build's directory: this build must ignore it and start its own.
    other = cache / (cold["stamp"] + "-other-build")
    stamp_dir(cache, cold).rename(other)
    second, err = run_program(tmp_path, cache)
    assert second["metrics"]["disk_cache_hits"] == 0
    assert second["metrics"]["disk_cache_writes"] == writes
    assert sorted(p.name for p in other.iterdir()) == ["meta.bin", "regions.bin"]

    # Files whose header names another stamp, placed in this build's directory: not read either.
    for name in ("meta.bin", "regions.bin"):
        f = stamp_dir(cache, cold) / name
        data = f.read_bytes()
        stamp = cold["stamp"].encode()
        assert stamp in data[: 64 + len(stamp)]
        f.write_bytes(data.replace(stamp, stamp[:-1] + (b"0" if stamp[-1:] != b"0" else b"1"), 1))
    third, err = run_program(tmp_path, cache)
    assert third["metrics"]["disk_cache_hits"] == 0
    assert third["metrics"]["compiles"] == cold["metrics"]["compiles"]
    assert err.count("is corrupt or truncated") == 1  # one warning per process, not per file


def test_unset_dir_writes_nothing(tmp_path):
    before = sorted(os.listdir(tmp_path))
    res, err = run_program(tmp_path, None)
    assert res["cache_dir"] is None
    assert all(res["metrics"][k] == 0 for k in ("disk_cache_hits", "disk_cache_misses", "disk_cache_writes"))
    assert sorted(os.listdir(tmp_path)) == sorted(before + ["program.py"])
    assert "disk cache" not in err


def test_unusable_dir_warns_once_and_stays_in_memory(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    res, err = run_program(tmp_path, blocker / "cache")
    assert err.count("is not usable") == 1
    assert res["cache_dir"] is None
    assert res["metrics"]["compiles"] > 0
    assert all(res["metrics"][k] == 0 for k in ("disk_cache_hits", "disk_cache_misses", "disk_cache_writes"))


def test_concurrent_processes_share_a_dir(tmp_path):
    cache = tmp_path / "cache"
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = child_env(cache)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            cwd=str(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert all("disk cache" not in e for _, e in outs)
    # Whatever the interleaving, the files hold only whole records: a later process reads every entry.
    after, err = run_program(tmp_path, cache)
    assert "disk cache" not in err
    assert after["metrics"]["compiles"] == 0 and after["metrics"]["disk_cache_writes"] == 0
    assert after["tpu_hex"] == json.loads(outs[0][0].strip().splitlines()[-1])["tpu_hex"]


def test_set_cache_dir_in_process(tmp_path):
    import torch_tpu_eager

    prev = torch_tpu_eager.cache_dir()  # TORCH_TPU_CACHE_DIR of this run, if any: restored below
    try:
        torch_tpu_eager.set_cache_dir(tmp_path / "c")
        assert torch_tpu_eager.cache_dir() == str(tmp_path / "c")
        torch_tpu_eager.reset_metrics()
        # A shape no other test uses, so the in-memory caches miss and the disk is consulted.
        x = torch.arange(13 * 7, dtype=torch.float32).reshape(13, 7)
        y = (x.to("tpu") * 3 - 1).relu().sum(dim=1).cpu()
        torch.testing.assert_close(y, (x * 3 - 1).relu().sum(dim=1))
        m = torch_tpu_eager.metrics()
        assert m["disk_cache_writes"] > 0
        stamp = torch_tpu_eager.disk_cache.cache_stamp()
        assert (tmp_path / "c" / stamp / "meta.bin").stat().st_size > 0

        with pytest.warns(UserWarning, match="is not usable"):
            torch_tpu_eager.set_cache_dir(tmp_path / "c" / stamp / "meta.bin" / "sub")
        assert torch_tpu_eager.cache_dir() is None
        with pytest.raises(TypeError):
            torch_tpu_eager.set_cache_dir(3)
        with pytest.raises(ValueError):
            torch_tpu_eager.set_cache_dir("")

        torch_tpu_eager.set_cache_dir(None)
        assert torch_tpu_eager.cache_dir() is None
        torch_tpu_eager._C._clear_cache()  # the in-memory region cache misses: compiles > 0 below
        torch_tpu_eager.reset_metrics()
        z = torch.arange(11 * 5, dtype=torch.float32).reshape(11, 5)
        torch.testing.assert_close((z.to("tpu") * 5).cpu(), z * 5)
        m = torch_tpu_eager.metrics()
        assert m["compiles"] > 0
        assert all(m[k] == 0 for k in ("disk_cache_hits", "disk_cache_misses", "disk_cache_writes"))
    finally:
        torch_tpu_eager.set_cache_dir(prev)


FORK_PROGRAM = r"""
import json, os, sys
import torch
import torch_tpu_eager

def work(offset):
    # Shapes no other process in this test uses: every call misses and appends.
    for n in range(3, 23):
        x = torch.arange(n * (n + offset), dtype=torch.float32).reshape(n, n + offset)
        y = ((x.to("tpu") + offset) * 0.5).sum(dim=0).cpu()
        torch.testing.assert_close(y, ((x + offset) * 0.5).sum(dim=0))

work(0)  # opens and reads the files before the fork
if sys.argv[1] == "fork":
    torch_tpu_eager.reset_metrics()
    pid = os.fork()
    if pid == 0:
        # CUDA's rule: a child forked after the parent used the device cannot use it.
        try:
            work(100)
            message = "no error"
        except RuntimeError as e:
            message = str(e)
        with open(sys.argv[2], "w") as f:
            f.write(message)
        os._exit(0)
    work(200)
    assert os.waitpid(pid, 0)[1] == 0
    child = open(sys.argv[2]).read()
else:
    torch_tpu_eager.reset_metrics()
    work(200)
    child = ""
m = torch_tpu_eager.metrics()
print(json.dumps({k: m[k] for k in ("disk_cache_hits", "disk_cache_writes", "compiles")} | {"child": child}))
"""


def test_forked_child_and_parent_share_a_dir(tmp_path):
    cache = tmp_path / "cache"
    script = tmp_path / "fork_program.py"
    script.write_text(FORK_PROGRAM)
    env = child_env(cache)

    def run(*args):
        out = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "disk cache" not in out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    forked = run("fork", str(tmp_path / "child.txt"))
    assert forked["disk_cache_writes"] > 0
    assert "Cannot re-initialize TPU in forked subprocess" in forked["child"], forked["child"]
    # The parent kept appending to the files it had open before the fork: a fresh
    # process doing the parent's work after the fork finds all of it on disk.
    fresh = run("plain")
    assert fresh["disk_cache_writes"] == 0 and fresh["compiles"] == 0
    assert fresh["disk_cache_hits"] == forked["disk_cache_writes"]


def _fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _rewrite_values(path, new_value):
    """Rewrites every record of a cache file (layout in csrc/jit/disk_cache.h) with
    value ``new_value(old)`` and a matching checksum; returns the record count."""
    import struct

    data = path.read_bytes()
    (stamp_len,) = struct.unpack_from("<I", data, 8)
    pos = 8 + 4 + stamp_len + 4
    out, n = bytearray(data[:pos]), 0
    while pos < len(data):
        magic, klen, vlen, _ = struct.unpack_from("<IIIQ", data, pos)
        body = pos + 20
        key, value = data[body : body + klen], new_value(data[body + klen : body + klen + vlen])
        out += struct.pack("<IIIQ", magic, klen, len(value), _fnv1a(value, _fnv1a(key))) + key + value
        pos, n = body + klen + vlen, n + 1
    path.write_bytes(bytes(out))
    return n


def test_well_formed_but_wrong_entries_are_misses_and_get_replaced(tmp_path, cold_run):
    cache, cold = cold_cache(cold_run, tmp_path)
    writes = cold["metrics"]["disk_cache_writes"]
    d = stamp_dir(cache, cold)
    # Checksums match, so the files load; the values cannot be decoded (meta: a count out of
    # range) or do not fit their region (regions: 0 ops): each is rejected, with one warning
    # per process (issue 18, "Bad input"), recompiled and replaced.
    n_meta = _rewrite_values(d / "meta.bin", lambda v: b"\xff" * 8)
    n_regions = _rewrite_values(d / "regions.bin", lambda v: b"\x00" * len(v))
    assert n_meta + n_regions == writes

    second, err = run_program(tmp_path, cache)
    assert err.count("does not match its key") == 1, err
    assert "is corrupt" not in err
    m2 = second["metrics"]
    assert m2["disk_cache_hits"] == 0
    assert m2["compiles"] == cold["metrics"]["compiles"]
    assert m2["disk_cache_writes"] == writes  # each wrong entry is replaced by a right one
    assert second["tpu_hex"] == cold["tpu_hex"]

    third, err = run_program(tmp_path, cache)
    assert "disk cache" not in err
    assert third["metrics"]["disk_cache_hits"] == writes and third["metrics"]["compiles"] == 0
