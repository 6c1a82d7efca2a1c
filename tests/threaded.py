"""Run a test's function on several threads and report their failures on the test's thread.

One helper for the tests that start threads, join them with a timeout and re-raise what
the threads raised (an exception on a thread would otherwise only be printed by
`threading.excepthook`, and the test would go on to fail on a missing result, or pass).
"""

import threading
from collections.abc import Callable, Iterable
from typing import Any


def run_threads(
    target: Callable[..., Any],
    args: Iterable[tuple[Any, ...]] = ((),),
    *,
    timeout: float = 300.0,
    one_at_a_time: bool = False,
    barrier: bool = False,
) -> None:
    """Call `target(*a)` on a new thread for each tuple `a` of `args`; wait for every thread.

    All threads start before any is joined (together), or, with `one_at_a_time`, each is
    joined before the next starts (threads that never overlap). With `barrier`, the threads
    wait for each other after starting and call `target` together (a threading.Barrier).
    `timeout` (seconds) bounds the wait for each thread; generous because the shared test
    machine runs at a load of 10-30.

    Raises: AssertionError if a thread is still running after its timeout (a hang); else
    the first exception (BaseException included) any thread raised, oldest first.
    """
    arg_list = [tuple(a) for a in args]
    gate = threading.Barrier(len(arg_list)) if barrier else None
    errors: list[BaseException] = []

    def body(*a: Any) -> None:
        try:
            if gate is not None:
                gate.wait()
            target(*a)
        except BaseException as e:  # noqa: BLE001 (re-raised on the test's thread below)
            errors.append(e)

    threads = [threading.Thread(target=body, args=a) for a in arg_list]
    if one_at_a_time:
        for t in threads:
            t.start()
            t.join(timeout)
            assert not t.is_alive(), f"a thread of {target.__name__} still runs after {timeout} s"
    else:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        hung = sum(t.is_alive() for t in threads)
        assert not hung, f"{hung} threads of {target.__name__} still run after {timeout} s"
    if errors:
        raise errors[0]
