// PyTorch's autograd worker thread for a device (pt_autograd_<index>) and
// interpreter shutdown.
#pragma once

#include <c10/core/Device.h>

namespace tpu_eager {

// Returns once the autograd device thread of `device` has finished every task
// it was running or had queued when called: it runs one no-op task through
// the engine on that thread and waits for it.
//
// Why: that thread drops its reference to a finished backward's GraphTask
// after the caller of backward() has returned. The GraphTask holds Python
// objects (the contextvars context torch.autograd stashes for device threads),
// so the thread then takes the GIL; if the interpreter is finalizing by then,
// CPython ends the thread with pthread_exit, whose unwinding through a
// noexcept destructor calls std::terminate ("terminate called without an
// active exception", exit 134). Called from an atexit handler (before
// finalization), this makes that release happen while Python is alive.
// Call without the GIL (the engine refuses to run with it held).
void drain_autograd_device_thread(c10::Device device);

}  // namespace tpu_eager
