// Python source locations of recorded ops. Recording keeps only an id of the
// innermost frame's (code object, bytecode offset); "file:line" is computed
// when an error names the op. Interning keeps the record path to a GIL
// round trip and one hash lookup.
#include "python/location.h"

#include <Python.h>
#include <frameobject.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lazy/queue.h"

namespace tpu_eager {
namespace {

struct PairHash {
  size_t operator()(const std::pair<PyObject*, int>& k) const {
    return std::hash<void*>()(k.first) * 31 + static_cast<size_t>(k.second);
  }
};

// Guarded by the GIL. Entries hold a reference to their code object, so an id
// stays valid for the life of the process; the table is bounded.
struct LocationTable {
  std::unordered_map<std::pair<PyObject*, int>, int32_t, PairHash> ids;
  std::vector<std::pair<PyObject*, int>> entries;
};
constexpr size_t kMaxEntries = 1 << 20;

LocationTable& table() {
  static auto* t = new LocationTable();  // never destroyed: holds Python references
  return *t;
}

// Torch's bindings release the GIL before dispatching, so take it back
// briefly; threads Python never saw (autograd workers) have no frame.
int32_t python_location_id() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return -1;
  PyGILState_STATE gil = PyGILState_Ensure();
  int32_t id = -1;
  if (PyFrameObject* f = PyEval_GetFrame()) {                             // borrowed
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(f));  // new reference
    const std::pair<PyObject*, int> key{code, PyFrame_GetLasti(f)};
    LocationTable& t = table();
    auto it = t.ids.find(key);
    if (it != t.ids.end()) {
      id = it->second;
      Py_DECREF(code);
    } else if (t.entries.size() < kMaxEntries) {
      id = static_cast<int32_t>(t.entries.size());
      t.entries.push_back(key);  // keeps the reference
      t.ids.emplace(key, id);
    } else {
      Py_DECREF(code);
    }
  }
  PyGILState_Release(gil);
  return id;
}

std::string format_location(int32_t id) {
  if (!Py_IsInitialized()) return {};
  PyGILState_STATE gil = PyGILState_Ensure();
  std::string where;
  LocationTable& t = table();
  if (id >= 0 && static_cast<size_t>(id) < t.entries.size()) {
    auto* code = reinterpret_cast<PyCodeObject*>(t.entries[id].first);
    if (const char* file = PyUnicode_AsUTF8(code->co_filename)) where = file;
    where += ":" + std::to_string(PyCode_Addr2Line(code, t.entries[id].second));
  }
  PyGILState_Release(gil);
  return where;
}

}  // namespace

void install_python_location_hooks() { set_location_hooks(&python_location_id, &format_location); }

}  // namespace tpu_eager
