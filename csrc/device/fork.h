// Fork safety, as CUDA's: a process forked after it used the device (its
// allocator) is "in bad fork". Other threads of the parent may have held the
// device's locks at the fork and do not exist in the child, so the child must
// not take them: every device entry point raises CUDA's RuntimeError there, and
// freeing a storage inherited from the parent leaks it (the child's copy of the
// parent's memory dies with the child). A child forked before any use works.
#pragma once

namespace tpu_eager {

// Installs the at-fork handler (once; idempotent). Called at import.
void install_fork_handler();

// Notes that this process uses the device (from the allocator); cheap.
void note_device_used();

// True in a process forked after its parent used the device.
bool in_bad_fork();

// True once this process used (or initialized) the device, and not in a bad fork
// (torch.tpu.is_initialized(), as torch.cuda.is_initialized()).
bool device_initialized();

// Raises RuntimeError "Cannot re-initialize TPU in forked subprocess. ..." in
// a bad fork; no-op otherwise. Takes no lock.
void check_not_in_bad_fork();

}  // namespace tpu_eager
