// KTIR-like tile programs (see ktir.h for the format).
#include "device/env.h"
#include "executors/spyre/ktir.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "executors/region_runner.h"
#include "executors/spyre/layout.h"

namespace tpu_eager {
namespace spyre {
namespace {

std::mutex g_mu;
std::vector<std::string>& last() {
  static auto* v = new std::vector<std::string>();  // never destroyed: flushes may run during shutdown
  return *v;
}
std::atomic<int64_t> g_dumped{0};

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string literal(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  std::ostringstream os;
  if (v.isTensor() && v.toTensor().dim() == 0) {  // a Python number the op received as a 0-dim tensor
    const c10::Scalar s = v.toTensor().item();
    if (s.isBoolean()) return s.toBool() ? "True" : "False";
    if (s.isIntegral(false)) return std::to_string(s.toLong());
    os << s.toDouble();
    return os.str();
  }
  os << v;
  return os.str();
}

}  // namespace

std::string ktir_text(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                      const CardParams& card) {
  const RegionLayout L = region_layout(region, graph, card);
  std::vector<std::string> ops;
  for (int i : region.nodes) {
    const Node& n = graph[i];
    std::vector<std::string> args(n.args.size());
    for (size_t a = 0; a < n.args.size(); ++a) args[a] = literal(n.args[a]);
    std::map<int, std::vector<std::pair<int, std::string>>> lists;
    for (const auto& in : n.inputs) {
      const std::string name = "%" + std::to_string(L.id(in.ref));
      if (in.elem < 0) args.at(in.arg) = name;
      else lists[in.arg].push_back({in.elem, name});
    }
    for (auto& [a, elems] : lists) {
      std::sort(elems.begin(), elems.end());
      std::string s = "[";
      for (size_t e = 0; e < elems.size(); ++e) s += (e ? ", " : "") + elems[e].second;
      args.at(a) = s + "]";
    }
    std::vector<std::string> outs;
    for (const auto& o : n.outputs) outs.push_back("%" + std::to_string(L.id(o)));
    std::string line = "  ";
    if (outs.size() == 1) line += outs[0] + " = ";
    if (outs.size() > 1) {
      line += "(";
      for (size_t j = 0; j < outs.size(); ++j) line += (j ? ", " : "") + outs[j];
      line += ") = ";
    }
    line += host::op_display_name(n).substr(6) + "(";
    for (size_t a = 0; a < args.size(); ++a) line += (a ? ", " : "") + args[a];
    ops.push_back(line + ")");
  }
  const int64_t per_core = L.rows_per_core;
  std::ostringstream os;
  os << "ktir.kernel @" << compiled.name << " grid=[" << L.cores << "] split=dim0 rows_per_core=" << per_core
     << " cores_used=" << L.cores_used << (L.ring_reduce ? " reduce=ring" : "") << " {\n";
  for (size_t v = 0; v < L.views.size(); ++v) {
    const TensorRef& r = *L.views[v].ref;
    os << "  %" << v << " = view " << (L.views[v].lx ? "LX" : "HBM") << " " << device_dtype_name(r.dtype)
       << " offset=" << r.offset << " sizes=" << list(r.sizes) << " strides=" << list(r.strides) << "\n";
  }
  for (size_t v = 0; v < L.views.size(); ++v) {
    const TensorRef& r = *L.views[v].ref;
    const bool split = L.views[v].split;
    std::vector<int64_t> tile = r.sizes;
    std::string at = "[";
    for (size_t d = 0; d < r.sizes.size(); ++d) {
      at += d ? ", " : "";
      at += (d == 0 && split) ? "core*" + std::to_string(per_core) : "0";
    }
    if (split) tile[0] = per_core;
    os << "  tile %" << v << " sizes=" << list(tile) << " at=" << at << "]\n";
  }
  for (const auto& line : ops) os << line << "\n";
  os << "}\n";
  return os.str();
}

std::vector<std::string> last_flush_ktir() {
  std::lock_guard<std::mutex> lock(g_mu);
  return last();
}

void ktir_begin_flush() {
  std::lock_guard<std::mutex> lock(g_mu);
  last().clear();
}

void ktir_record(const std::string& name, std::string text) {
  if (const auto dir = env::raw("TORCH_TPU_DUMP_DIR")) {
    char num[32];
    std::snprintf(num, sizeof num, "%06lld", static_cast<long long>(g_dumped.fetch_add(1)));
    std::ofstream f(*dir + "/region_" + num + "_" + name + ".ktir");
    f << text;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  last().push_back(std::move(text));
}

}  // namespace spyre
}  // namespace tpu_eager
