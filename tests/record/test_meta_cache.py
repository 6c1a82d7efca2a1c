"""The record path's meta-inference cache must not outlive the state it depends on."""

import torch

from difftest import requires_tpu

pytestmark = requires_tpu


def test_default_dtype_change_is_not_served_from_the_meta_cache():
    # int tensor * float scalar promotes to the default dtype: the same op on the same
    # argument metadata must follow a torch.set_default_dtype in between.
    x_cpu = torch.arange(4)
    x = x_cpu.to("tpu")
    before = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            for fn in (lambda t: t * 0.5, lambda t: t / 2, lambda t: t + 1.5):
                got, want = fn(x), fn(x_cpu)
                assert got.dtype == want.dtype == dtype
                torch.testing.assert_close(got.cpu(), want)
    finally:
        torch.set_default_dtype(before)


def test_interned_meta_keys_stay_bounded_under_a_shape_storm():
    # Every distinct meta key gets an id (Node::meta_id, the flush structure's word for the
    # op); the table is the meta cache, bounded: a program of 30,000 shapes must not grow it
    # without end. Ids are never given twice, so a key cached again after the cache emptied
    # gets a new id, and its flush plans anew (a miss), with CPU's values.
    from torch_tpu_eager import _C

    import torch_tpu_eager as tte

    limit = _C._meta_cache_stats()["limit"]
    _C._set_meta_cache_limit(500)
    try:
        big = torch.arange(30000, dtype=torch.float32)
        bigd = big.to("tpu")
        first = (bigd[:7] * 2.0).neg()
        torch.testing.assert_close(first.cpu(), (big[:7] * 2.0).neg())
        start = _C._meta_cache_stats()
        for n in range(1, 30001):
            bigd[:n].neg()  # a distinct shape each time; the result is dropped
            if n % 5000 == 0:
                st = _C._meta_cache_stats()
                assert st["entries"] <= 500 == st["limit"], st
        st = _C._meta_cache_stats()
        assert st["entries"] <= 500 and st["last_id"] - start["last_id"] >= 30000, (start, st)
        hits = tte.metrics()["flush_cache_hits"]
        again = (bigd[:7] * 2.0).neg()  # its keys were dropped: new ids, a new structure
        torch.testing.assert_close(again.cpu(), (big[:7] * 2.0).neg())
        assert tte.metrics()["flush_cache_hits"] == hits
    finally:
        _C._set_meta_cache_limit(limit)
    assert _C._meta_cache_stats()["limit"] == limit


def test_long_meta_keys_are_exact_and_hit():
    # The meta key is written into a fixed buffer first and spills into a vector past it
    # (ops/record.cpp KeyWriter): a cat of 12 rank-4 tensors keys ~140 words. The same call
    # again hits (no new interned id), one that differs only in its last tensor's strides
    # (words past the buffer) misses once; a short key after the long ones is not polluted
    # by their words. Values against CPU.
    from torch_tpu_eager import _C

    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 3, 4, 5, generator=gen) for _ in range(12)]
    dev = [p.to("tpu") for p in parts]
    torch.testing.assert_close(torch.cat(dev, dim=1).cpu(), torch.cat(parts, dim=1))
    ids = _C._meta_cache_stats()["last_id"]
    torch.testing.assert_close(torch.cat(dev, dim=1).cpu(), torch.cat(parts, dim=1))
    assert _C._meta_cache_stats()["last_id"] == ids  # an exact hit

    last_t = parts[-1].transpose(2, 3).contiguous().transpose(2, 3)  # same sizes, other strides
    parts2, dev2 = parts[:-1] + [last_t], dev[:-1] + [last_t.to("tpu")]
    torch.testing.assert_close(torch.cat(dev2, dim=1).cpu(), torch.cat(parts2, dim=1))
    assert _C._meta_cache_stats()["last_id"] > ids  # a new key, not the first call's
    ids = _C._meta_cache_stats()["last_id"]
    torch.testing.assert_close(torch.cat(dev2, dim=1).cpu(), torch.cat(parts2, dim=1))
    assert _C._meta_cache_stats()["last_id"] == ids

    a = torch.randn(3, generator=gen)
    torch.testing.assert_close((a.to("tpu") * 2.0).cpu(), a * 2.0)
