// The Work of a point-to-point transfer of the "tpu" c10d backend (tpu_ccl).
//
// A send or receive on "tpu" runs gloo's send/recv on a host buffer; a receive
// then has to copy the message into the chip's tensor when the program waits
// for it. The Python kernels (torch_tpu_eager/distributed/backend.py) express
// that step as a c10d PythonCallbackWork, but such a Work answers nothing else
// the way gloo's does: its sourceRank() raises (torch.distributed.recv without
// a source calls it), and its future completes only in wait(). This op joins
// the two:
//
//   tpu_eager::_p2p_work(Work transfer, Work finish) -> Work
//
// returns a Work whose wait() and synchronize() are `finish`'s (gloo's wait,
// the copy into the chip), whose sourceRank(), exception() and getFuture() are
// `transfer`'s (gloo's: the sender's rank of a receive from any source;
// "Work::getFuture not implemented." for a point-to-point transfer, as gloo
// answers on CPU tensors), and which is completed when gloo's transfer is
// (gloo completes a point-to-point Work in its wait(); isCompleted() then runs
// `finish`, so the received data is in the chip's tensor when it returns true).
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <chrono>
#include <exception>
#include <utility>

namespace tpu_eager {
namespace distributed {
namespace {

class P2PWork : public ::c10d::Work {
 public:
  P2PWork(c10::intrusive_ptr<::c10d::Work> transfer, c10::intrusive_ptr<::c10d::Work> finish)
      : transfer_(std::move(transfer)), finish_(std::move(finish)) {}

  bool isCompleted() override {
    if (!transfer_->isCompleted()) return false;
    if (transfer_->exception() == nullptr) finish_->wait();  // its error, if any, is raised by wait()
    return true;
  }

  bool isSuccess() const override { return transfer_->exception() == nullptr; }

  std::exception_ptr exception() const override { return transfer_->exception(); }

  int sourceRank() const override { return transfer_->sourceRank(); }

  void synchronize() override { finish_->wait(); }

  bool wait(std::chrono::milliseconds timeout) override { return finish_->wait(timeout); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return transfer_->getFuture(); }

 private:
  c10::intrusive_ptr<::c10d::Work> transfer_;
  c10::intrusive_ptr<::c10d::Work> finish_;
};

c10::intrusive_ptr<::c10d::Work> p2p_work(const c10::intrusive_ptr<::c10d::Work>& transfer,
                                          const c10::intrusive_ptr<::c10d::Work>& finish) {
  return c10::make_intrusive<P2PWork>(transfer, finish);
}

}  // namespace
}  // namespace distributed
}  // namespace tpu_eager

TORCH_LIBRARY_FRAGMENT(tpu_eager, m) {
  m.def(
      "_p2p_work(__torch__.torch.classes.c10d.Work transfer, __torch__.torch.classes.c10d.Work finish) -> "
      "__torch__.torch.classes.c10d.Work",
      TORCH_FN(tpu_eager::distributed::p2p_work));
}
