// Draining the autograd device thread before interpreter shutdown (autograd_threads.h).
#include "device/autograd_threads.h"

#include <ATen/ops/empty.h>
#include <c10/core/AutogradState.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

namespace tpu_eager {
namespace {

// A graph of one node that does nothing. The engine runs a node on the thread
// of its input's device, after the task that thread is running now.
struct NoOp final : torch::autograd::Node {
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override { return {}; }
  std::string name() const override { return "TpuAutogradThreadDrain"; }
};

// Autograd multithreading on for this thread while alive (c10::AutogradState).
class MultithreadingOn {
 public:
  MultithreadingOn() : was_(c10::AutogradState::get_tls_state().get_multithreading_enabled()) {
    c10::AutogradState::get_tls_state().set_multithreading_enabled(true);
  }
  ~MultithreadingOn() { c10::AutogradState::get_tls_state().set_multithreading_enabled(was_); }
  MultithreadingOn(const MultithreadingOn&) = delete;
  MultithreadingOn& operator=(const MultithreadingOn&) = delete;

 private:
  bool was_;
};

}  // namespace

void drain_autograd_device_thread(c10::Device device) {
  // A 0-dim tensor records nothing: the allocator only.
  at::Tensor grad = at::empty({}, at::TensorOptions().device(device));
  auto node = c10::make_intrusive<NoOp>();
  node->add_input_metadata(grad);
  // The engine sends the no-op to the device thread only when this thread has
  // autograd multithreading on; the importing thread has it off
  // (TORCH_TPU_BACKWARD_ON_CALLER), and the no-op would then run here, at once,
  // without waiting for the device thread. On for this call, restored after.
  MultithreadingOn multithreading;
  // Called from C++, not torch.autograd.backward: the GraphTask captures no
  // Python object of its own, so its release on the device thread needs no GIL.
  torch::autograd::Engine::get_default_engine().execute({torch::autograd::Edge(node, 0)}, {grad},
                                                        /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);
}

}  // namespace tpu_eager
