// ReduceOp.PREMUL_SUM's factor, for the Python kernels of the c10d ops on "tpu".
//
// A c10d collective op (c10d::allreduce_, c10d::reduce_scatter_, ...) receives
// its reduce op boxed as the TorchScript class __torch__.torch.classes.c10d.ReduceOp,
// whose only Python-visible method is op(): PREMUL_SUM's factor (the
// supplement of c10d::ReduceOp, torch/csrc/distributed/c10d/Types.hpp) is not
// visible to a kernel written in Python. This op reads it:
//
//   tpu_eager::_premul_sum_factor(ReduceOp op) -> (float, Tensor?)
//
// returns (factor, None) for a factor given as a number, (0.0, tensor) for one
// given as a 1-element tensor, and raises ValueError for another op.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace tpu_eager {
namespace distributed {
namespace {

std::tuple<double, std::optional<at::Tensor>> premul_sum_factor(const c10::intrusive_ptr<::c10d::ReduceOp>& op) {
  TORCH_CHECK_VALUE(op->op_ == ::c10d::ReduceOp::PREMUL_SUM, "_premul_sum_factor: not a PREMUL_SUM op (op ",
                    static_cast<int>(op->op_), ")");
  // As torch's NCCL backend reads it: a PREMUL_SUM op's supplement is a PreMulSumSupplement.
  const auto* s = static_cast<const ::c10d::PreMulSumSupplement*>(op->supplement_.get());
  TORCH_CHECK_VALUE(s != nullptr,
                    "ReduceOp.PREMUL_SUM without a factor: make it with "
                    "torch.distributed._make_nccl_premul_sum(factor)");
  if (s->tensor_factor.defined()) return {0.0, s->tensor_factor};
  return {s->double_factor, std::nullopt};
}

}  // namespace
}  // namespace distributed
}  // namespace tpu_eager

TORCH_LIBRARY_FRAGMENT(tpu_eager, m) {
  m.def("_premul_sum_factor(__torch__.torch.classes.c10d.ReduceOp op) -> (float, Tensor?)",
        TORCH_FN(tpu_eager::distributed::premul_sum_factor));
}
