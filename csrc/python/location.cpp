// Python source locations of recorded ops. Recording keeps only an id of the
// innermost frame's (code object, bytecode offset); "file:line" is computed
// when an error names the op. Interning keeps the record path to a GIL
// round trip and one hash lookup.
#include "python/location.h"

#include <Python.h>
#include <frameobject.h>

// CPython 3.11: the innermost frame of this thread can be read without the
// GIL (see current_key). Other versions take the GIL for every op.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define TPU_EAGER_FRAME_WITHOUT_GIL 1
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

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

#ifdef TPU_EAGER_FRAME_WITHOUT_GIL
// The (code object, bytecode offset in bytes, as PyFrame_GetLasti) of the
// innermost complete frame of `ts`, this thread's own state. Torch's bindings
// released the GIL before dispatching, but this thread is blocked inside the
// call, so its frames cannot change and the frame holds its code object:
// reading them needs no lock.
bool current_key(PyThreadState* ts, std::pair<PyObject*, int>* key) {
  _PyInterpreterFrame* f = ts->cframe ? ts->cframe->current_frame : nullptr;
  while (f && _PyFrame_IsIncomplete(f)) f = f->previous;
  if (!f) return false;
  const int lasti = _PyInterpreterFrame_LASTI(f);
  *key = {reinterpret_cast<PyObject*>(f->f_code), lasti < 0 ? -1 : lasti * static_cast<int>(sizeof(_Py_CODEUNIT))};
  return true;
}

// Per-thread, direct-mapped: (code, offset) -> id for keys the table holds
// (so the code object outlives the entry). A hit takes neither the GIL nor a lock.
struct LocalCache {
  struct Entry {
    PyObject* code = nullptr;
    int lasti = 0;
    int32_t id = -1;
  };
  Entry e[256];
};
#endif

// The id of `key` in the table, adding it (with a new reference to its code
// object) when absent; -1 when the table is full. Call with the GIL held.
int32_t intern(const std::pair<PyObject*, int>& key) {
  LocationTable& t = table();
  auto it = t.ids.find(key);
  if (it != t.ids.end()) return it->second;
  if (t.entries.size() >= kMaxEntries) return -1;
  const auto id = static_cast<int32_t>(t.entries.size());
  Py_INCREF(key.first);  // the entry keeps its code object (and so its address) alive
  t.entries.push_back(key);
  t.ids.emplace(key, id);
  return id;
}

// Torch's bindings release the GIL before dispatching, so take it back
// briefly (on CPython 3.11 only when the per-thread cache misses); threads
// Python never saw (autograd workers) have no frame.
int32_t python_location_id() {
  if (!Py_IsInitialized()) return -1;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return -1;
#ifdef TPU_EAGER_FRAME_WITHOUT_GIL
  static thread_local LocalCache cache;
  std::pair<PyObject*, int> key;
  if (!current_key(ts, &key)) return -1;
  LocalCache::Entry& slot = cache.e[PairHash()(key) & 255];
  if (slot.code == key.first && slot.lasti == key.second) return slot.id;
  PyGILState_STATE gil = PyGILState_Ensure();
  const int32_t id = intern(key);
  PyGILState_Release(gil);
  if (id >= 0) slot = {key.first, key.second, id};
  return id;
#else
  PyGILState_STATE gil = PyGILState_Ensure();
  int32_t id = -1;
  if (PyFrameObject* f = PyEval_GetFrame()) {                          // borrowed
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(f));  // new reference
    id = intern({code, PyFrame_GetLasti(f)});
    Py_DECREF(code);
  }
  PyGILState_Release(gil);
  return id;
#endif
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
