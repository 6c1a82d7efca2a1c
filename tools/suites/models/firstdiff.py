"""First module whose forward output differs: python firstdiff.py SUITE NAME

Run with PYTHONPATH=<tree>:<sweep>/site. Forward hooks record every module's floating
outputs on CPU and on tpu (tpu's kept as lazy tensors until the end, so the device does not
flush at every module); the first module (in call order) whose output is not bit-equal is
printed, and that module alone is run on CPU's recorded inputs on both devices.
"""

import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tvshim  # noqa: F401,E402
import torch  # noqa: E402

torch.set_num_threads(1)
import torch_tpu_eager  # noqa: F401,E402

if os.environ.get("SWEEP_FUSED_MATH"):
    torch_tpu_eager.set_fused_math(os.environ["SWEEP_FUSED_MATH"])
import models  # noqa: E402
import worker  # noqa: E402  (its helpers; worker's main does not run on import)


def detach(obj, device=None):
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to(device) if device else t.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(detach(v, device) for v in obj) if not hasattr(obj, "_fields") else obj
    if isinstance(obj, dict):
        return {k: detach(v, device) for k, v in obj.items()}
    return obj


def record(model, log):
    hs = []
    for n, m in model.named_modules():
        if n == "":
            continue

        def hook(mod, args, kwargs, out, n=n):
            log.append((n, detach(args), detach(kwargs), worker.floats(out, [])))

        hs.append(m.register_forward_hook(hook, with_kwargs=True))
    return hs


def main():
    suite, name = sys.argv[1], sys.argv[2]
    mode = os.environ.get("SWEEP_MODE", "train")
    model, inputs, _ = models.build({"suite": suite, "name": name})
    getattr(model, mode)()
    tmodel = copy.deepcopy(model).to("tpu")
    clog, tlog = [], []
    record(model, clog)
    record(tmodel, tlog)
    worker.step(model, inputs)
    worker.step(tmodel, worker.to(inputs, "tpu"))
    for (n, a, k, co), (n2, _, _, to) in zip(clog, tlog):
        assert n == n2, (n, n2)
        to = [t.cpu() for t in to]
        if len(co) == len(to) and all(torch.equal(c, t) for c, t in zip(co, to)):
            continue
        d = max(((c.double() - t.double()).abs().max().item() for c, t in zip(co, to) if c.numel()), default=0)
        mod = dict(model.named_modules())[n]
        print(f"first differing module: {n} ({type(mod).__name__}), max |tpu - cpu| {d:.3g}")
        tmod = copy.deepcopy(mod).to("tpu")
        with torch.no_grad():
            c1 = worker.floats(mod(*a, **k), [])
            t1 = [t.cpu() for t in worker.floats(tmod(*detach(a, "tpu"), **detach(k, "tpu")), [])]
        alone = max(((c.double() - t.double()).abs().max().item() for c, t in zip(c1, t1) if c.numel()), default=0)
        print(f"alone on CPU's inputs: {'bit-equal' if alone == 0 else f'differs, max {alone:.3g}'}")
        return
    print("all module outputs bit-equal")


if __name__ == "__main__":
    main()
