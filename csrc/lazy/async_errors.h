// Errors of failed ops that no read has reported yet, per chip, reported at the
// chip's next synchronizing call (CUDA's asynchronous error reporting).
//
// On CPU a failing op raises at its call. Deferred, an op whose check needs
// values computed on the device (an index computed there, a Scalar from a
// tensor that does not fit the result's dtype) fails at a flush; the first read
// of a tensor it (or an op depending on it) should have written raises its
// error (queue.h, raise_storage_error). When no such read comes (the value
// dies unread, as the forward embedding of `embedding(idx, w).sum().backward()`
// does), the error would be lost. CUDA reports such an error ("device-side
// assert triggered ... may be asynchronously reported at some other API call")
// at the next call that synchronizes with the device. So does this device:
// each chip keeps the errors of its failed flushes that have not reached the
// user, oldest first, and
// - the chip's next synchronize (torch.tpu.synchronize,
//   torch.accelerator.synchronize, Stream.synchronize, Event.synchronize)
//   raises the oldest one;
// - the next read of any of its tensors to the host raises the oldest one that
//   no tensor holds any more (a "lost" failure: no read could report it). One
//   a tensor still holds is left to that tensor's read, so reads of unrelated
//   tensors stay valid while the failed value can still be read.
// Each is reported once. Unlike CUDA's sticky error, the chip stays usable:
// the queue and every tensor the failure did not reach keep their values, and
// the tensors that hold the error still raise it when read.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <vector>

#include "lazy/queue.h"

namespace tpu_eager {

struct DeferredStorage;

// After a flush of `device` whose first error is `first` (null: nothing
// failed; then a no-op): keeps every error of the storages `nodes` write that
// has not reached the user, `first` first. With `reported`, the caller raises
// `first` itself, so it is not kept. Called by flush_device under the chip's flush lock.
void note_flush_errors(int device, const std::vector<Node>& nodes, const std::exception_ptr& first, bool reported);

// The oldest error of `device` that no read or synchronizing call has reported,
// or null. It leaves the list and counts as seen (note_error_seen), as do the
// storages that still hold it (DeferredStorage::error_seen: a whole overwrite
// then clears them). Each failure is reported once, in the order they failed:
// as on CPU, where each failing call raises once.
// `only_lost`: the oldest of those that no tensor holds any more (no live
// storage still has it as its error), for host reads.
std::exception_ptr take_unreported_error(int device, bool only_lost = false);

// Raises take_unreported_error(device, /*only_lost=*/true), if any: what a read
// to the host reports. One relaxed atomic load when no chip has an unreported error.
void raise_lost_error(int device);

// Runs the pending ops of `device` and returns the error a synchronizing call
// raises: the oldest unreported one of the device (an earlier flush's, else
// this flush's first), or null.
std::exception_ptr synchronize_errors(int device, FlushReason reason);

// `e` reached the user (a read raised it): not unreported on any device.
// Called by note_error_seen.
void forget_unreported_error(const std::exception_ptr& e);

// Runs `fn` under chip `device`'s flush lock (no flush writes the error of a
// storage of that chip meanwhile; a flush writes only its own chip's
// storages), waiting for it as flush_device does. Defined in queue.cpp.
void with_chip_flush_lock(int device, c10::function_ref<void()> fn);

// Unreported errors kept over all chips (the lists' entries). Read without
// the lists' lock by the checks that skip them when there are none.
extern std::atomic<int64_t> g_unreported_errors;
// `s` is being destroyed: no list keeps a pointer to it. Inline: one relaxed
// atomic load when no chip has an unreported error (DeferredStorage's
// destructor, for each dying intermediate of a flush; the call and the lists'
// lazily made static were ~15 instructions a storage).
void forget_unreported_storage_listed(const DeferredStorage* s);
inline void forget_unreported_storage(const DeferredStorage* s) {
  if (C10_UNLIKELY(g_unreported_errors.load(std::memory_order_relaxed) != 0)) forget_unreported_storage_listed(s);
}

}  // namespace tpu_eager
