// The products of a matmul-family op (see matmul_shapes.h).
#include "executors/matmul_shapes.h"

#include <string>
#include <utility>

namespace tpu_eager {

const TensorRef* arg_ref(const Node& n, int arg) {
  for (const auto& in : n.inputs)
    if (in.arg == arg && in.elem < 0) return &in.ref;
  return nullptr;
}

bool gemms_of(const Node& n, std::vector<Gemm>& out, c10::ScalarType& ta, c10::ScalarType& tb) {
  std::string base = n.op.schema().name().substr(6);  // drop "aten::"
  if (!base.empty() && base.back() == '_') base.pop_back();
  auto operands = [&](int ia, int ib) -> std::pair<const TensorRef*, const TensorRef*> {
    const TensorRef* a = arg_ref(n, ia);
    const TensorRef* b = arg_ref(n, ib);
    if (a && b) {
      ta = a->dtype;
      tb = b->dtype;
    }
    return {a, b};
  };
  auto dims_ok = [](const TensorRef* r, size_t rank) { return r && r->sizes.size() == rank; };

  if (base == "mm" || base == "addmm") {
    auto [a, b] = base == "mm" ? operands(0, 1) : operands(1, 2);
    if (!dims_ok(a, 2) || !dims_ok(b, 2)) return false;
    out.push_back({1, double(a->sizes[0]), double(a->sizes[1]), double(b->sizes[1])});
    return true;
  }
  if (base == "bmm" || base == "baddbmm" || base == "addbmm") {
    auto [a, b] = base == "bmm" ? operands(0, 1) : operands(1, 2);
    if (!dims_ok(a, 3) || !dims_ok(b, 3)) return false;
    out.push_back({double(a->sizes[0]), double(a->sizes[1]), double(a->sizes[2]), double(b->sizes[2])});
    return true;
  }
  if (base == "mv" || base == "addmv") {
    auto [a, b] = base == "mv" ? operands(0, 1) : operands(1, 2);
    if (!dims_ok(a, 2) || !dims_ok(b, 1)) return false;
    out.push_back({1, double(a->sizes[0]), double(a->sizes[1]), 1});
    return true;
  }
  if (base == "dot" || base == "vdot") {
    auto [a, b] = operands(0, 1);
    if (!dims_ok(a, 1) || !dims_ok(b, 1)) return false;
    out.push_back({1, 1, double(a->sizes[0]), 1});
    return true;
  }
  if (base == "addr") {  // outer product: K = 1
    auto [a, b] = operands(1, 2);
    if (!dims_ok(a, 1) || !dims_ok(b, 1)) return false;
    out.push_back({1, double(a->sizes[0]), 1, double(b->sizes[0])});
    return true;
  }
  return false;
}

}  // namespace tpu_eager
