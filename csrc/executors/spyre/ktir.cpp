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
#include "executors/spyre/ktir_ir.h"
#include "jit/disk_cache.h"

namespace tpu_eager {
namespace spyre {
namespace {

std::mutex g_mu;
std::vector<std::string>& last() {
  static auto* v = new std::vector<std::string>();  // never destroyed: flushes may run during shutdown
  return *v;
}
std::atomic<int64_t> g_dumped{0};

// Writes one region's program to `dir` (made with its parents on first use,
// as torch.compile's debug directories are). A directory that cannot be made
// or written warns once per value of the variable instead of dropping the
// programs silently; the run goes on.
void dump(const std::string& dir, const std::string& name, const std::string& text) {
  static std::mutex mu;
  static std::string made, warned;
  std::string err;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (made != dir) {
      err = disk_cache::make_dirs(dir);
      if (err.empty()) made = dir;
    }
  }
  if (err.empty()) {
    char num[32];
    std::snprintf(num, sizeof num, "%06lld", static_cast<long long>(g_dumped.fetch_add(1)));
    const std::string path = dir + "/region_" + num + "_" + name + ".ktir";
    std::ofstream f(path);
    f << text;
    if (!f) err = path + ": cannot be written";
  }
  if (err.empty()) return;
  std::lock_guard<std::mutex> lock(mu);
  if (warned == dir) return;
  warned = dir;
  TORCH_WARN("TORCH_TPU_DUMP_DIR=", dir, " is not usable (", err, "); KTIR programs are not written");
}

}  // namespace

std::string ktir_text(const CompiledRegion& compiled, const Region& region, const std::vector<Node>& graph,
                      const CardParams& card) {
  return ktir_print(ktir_build(compiled, region, graph, card));
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
  if (const auto dir = env::raw("TORCH_TPU_DUMP_DIR")) dump(*dir, name, text);
  std::lock_guard<std::mutex> lock(g_mu);
  last().push_back(std::move(text));
}

}  // namespace spyre
}  // namespace tpu_eager
