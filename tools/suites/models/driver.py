"""Run a shard of the cases in worker processes: python driver.py cases.json out.jsonl k/n

Restarts the worker after a crash, after a failure on tpu, every 25 cases, and after a case
that reports no phase for SWEEP_TIMEOUT seconds (its stacks are dumped into the record).
Env: SWEEP_TIMEOUT (90), SWEEP_ONLY=a,b (case names); the others pass to the worker.
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = float(os.environ.get("SWEEP_TIMEOUT", "90"))


class Worker:
    def __init__(self):
        self.err = tempfile.NamedTemporaryFile("w+", prefix="sweep_err_", delete=False)
        env = dict(os.environ)
        # torch autoloads the installed backend at `import torch`: the tree must come first on the path.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ["TPU_REPO"], os.path.join(HERE, "site"), os.environ.get("PYTHONPATH")) if p
        )
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py")],
            stdin=subprocess.PIPE,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            bufsize=1,
        )
        os.set_blocking(self.p.stdout.fileno(), True)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.p.stdout, selectors.EVENT_READ)
        self.count = 0
        self.buf = b""

    def lines(self):
        """Complete lines read so far (select() sees the pipe, not a reader's buffer)."""
        data = os.read(self.p.stdout.fileno(), 1 << 16)
        if not data:
            return None
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        return [d.decode() for d in done]

    def tail(self, n=6000):
        self.err.flush()
        with open(self.err.name) as f:
            return f.read()[-n:]

    def run(self, case):
        self.count += 1
        self.p.stdin.write(json.dumps(case) + "\n")
        self.p.stdin.flush()
        last, ph = time.time(), "start"
        while True:
            if not self.sel.select(timeout=max(0.1, TIMEOUT - (time.time() - last))):
                if time.time() - last < TIMEOUT:
                    continue
                self.p.send_signal(signal.SIGUSR1)
                time.sleep(2)
                stacks = self.tail()
                return dict(case, status="timeout", phase=ph, stacks=stacks), True
            lines = self.lines()
            if lines is None:
                self.p.wait()
                return dict(case, status="crash", phase=ph, returncode=self.p.returncode, stderr=self.tail(3000)), True
            for line in lines:
                msg = json.loads(line)
                if "phase" in msg:
                    last, ph = time.time(), msg["phase"]
                    continue
                r = msg["result"]
                restart = r["status"] in ("error", "mismatch") or self.count >= 25
                return r, restart

    def close(self):
        try:
            self.p.kill()
            self.p.wait()
        finally:
            os.unlink(self.err.name)


def main():
    cases = json.load(open(sys.argv[1]))
    k, n = map(int, sys.argv[3].split("/"))
    only = os.environ.get("SWEEP_ONLY")
    if only:
        names = set(only.split(","))
        cases = [c for c in cases if c["name"] in names]
    cases = cases[k::n]
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[2])), exist_ok=True)
    w = None
    with open(sys.argv[2], "a") as out:
        for c in cases:
            if w is None:
                w = Worker()
            r, restart = w.run(c)
            r.setdefault("load_end", os.getloadavg()[0])
            r["env"] = {e: v for e, v in os.environ.items() if e.startswith("SWEEP_")}
            out.write(json.dumps(r) + "\n")
            out.flush()
            print(f"{r['suite']:12s} {r['name']:40s} {r['status']}", flush=True)
            if restart:
                w.close()
                w = None
    if w is not None:
        w.close()


if __name__ == "__main__":
    main()
