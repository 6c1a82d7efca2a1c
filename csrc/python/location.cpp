// Python source locations of recorded ops. Recording keeps only an id of the
// innermost frame's (code object, bytecode offset) and, when that frame is in
// library code (torch, torch_tpu_eager, the standard library), of the innermost
// frame outside it: the user's line, which messages name (an op torch.nn
// creates is reported at the user's line that called the module or function).
// "file:line" is computed when a message names the op. Interning keeps the
// record path to one per-thread cache lookup (CPython 3.11) or a GIL round trip.
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

using Frame = std::pair<PyObject*, int>;  // (code object, bytecode offset in bytes)

// The innermost frame and, when it is library code, the innermost user frame
// ({nullptr, -1} when it is not, or when every frame is library code).
struct Key {
  Frame inner;
  Frame user{nullptr, -1};
  bool operator==(const Key& o) const { return inner == o.inner && user == o.user; }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    auto h = [](const Frame& f) { return std::hash<void*>()(f.first) * 31 + static_cast<size_t>(f.second); };
    return h(k.inner) * 1000003u ^ h(k.user);
  }
};

// Guarded by the GIL. Entries hold a reference to their code objects, so an id
// stays valid for the life of the process; the table is bounded.
struct LocationTable {
  std::unordered_map<Key, int32_t, KeyHash> ids;
  std::vector<Key> entries;
  // Path prefixes of library code (set_library_paths), and the verdict for each
  // code object seen (holding a reference to it, so its address stays unique).
  std::vector<std::string> library_prefixes;
  std::string stdlib_prefix;
  std::unordered_map<PyObject*, bool> is_library;
};
constexpr size_t kMaxEntries = 1 << 20;

LocationTable& table() {
  static auto* t = new LocationTable();  // never destroyed: holds Python references
  return *t;
}

// A per-thread cache of 256 sets of two entries, most recently used first. A
// record looks up every frame of its walk and a few dozen keys per training
// step; with one entry per set, two keys that share a set evict each other on
// every step, and each such miss takes the GIL. The set comes from the high
// bits of a multiplicative hash, so addresses that differ only in their high
// bits (code objects, 16-byte aligned) do not share sets.
template <typename K, typename V>
class TwoWayCache {
 public:
  // The value cached for `key` (whose hash is `hash`), or nullptr.
  const V* find(const K& key, size_t hash) {
    Entry* s = sets_[set_of(hash)];
    if (s[0].used && s[0].key == key) return &s[0].value;
    if (!s[1].used || !(s[1].key == key)) return nullptr;
    std::swap(s[0], s[1]);
    return &s[0].value;
  }
  void put(const K& key, size_t hash, V value) {
    Entry* s = sets_[set_of(hash)];
    if (!(s[0].used && s[0].key == key)) s[1] = s[0];
    s[0] = Entry{key, value, true};
  }

 private:
  struct Entry {
    K key{};
    V value{};
    bool used = false;
  };
  static size_t set_of(size_t hash) { return static_cast<size_t>((hash * 0x9E3779B97F4A7C15ull) >> 56); }
  Entry sets_[256][2];
};

// Per-thread verdicts (library code or not) for code objects the table holds.
using LibraryCache = TwoWayCache<PyObject*, bool>;

// Not inlined: GCC computed an inlined thread_local's address again (a __tls_get_addr call
// in a shared library) at each use, also once per frame of a walk.
__attribute__((noinline)) LibraryCache& library_cache() {
  static thread_local LibraryCache cache;
  return cache;
}

bool path_is_library(const LocationTable& t, const char* file) {
  const std::string f = file ? file : "";
  for (const auto& p : t.library_prefixes)
    if (!p.empty() && f.compare(0, p.size(), p) == 0) return true;
  // The standard library, but not the packages installed under it.
  return !t.stdlib_prefix.empty() && f.compare(0, t.stdlib_prefix.size(), t.stdlib_prefix) == 0 &&
         f.find("-packages") == std::string::npos;
}

// Whether `code` is library code, cached in `cache` (this thread's library_cache()). Call
// with the GIL held.
bool classify(PyObject* code, LibraryCache& cache) {
  LocationTable& t = table();
  auto it = t.is_library.find(code);
  bool lib;
  if (it != t.is_library.end()) {
    lib = it->second;
  } else {
    lib = path_is_library(t, PyUnicode_AsUTF8(reinterpret_cast<PyCodeObject*>(code)->co_filename));
    if (!PyErr_Occurred()) {
      Py_INCREF(code);  // keeps the address unique while the verdict is cached
      t.is_library.emplace(code, lib);
    } else {
      PyErr_Clear();
    }
  }
  cache.put(code, reinterpret_cast<uintptr_t>(code), lib);
  return lib;
}

// The verdict for `code` from `cache` (this thread's library_cache()); false in *known when absent.
bool cached_library(PyObject* code, LibraryCache& cache, bool* known) {
  const bool* lib = cache.find(code, reinterpret_cast<uintptr_t>(code));
  *known = lib != nullptr;
  return lib && *lib;
}

#ifdef TPU_EAGER_FRAME_WITHOUT_GIL
// The (code object, bytecode offset in bytes, as PyFrame_GetLasti) of the
// innermost complete frame of `ts`, this thread's own state. Torch's bindings
// released the GIL before dispatching, but this thread is blocked inside the
// call, so its frames cannot change and the frame holds its code object:
// reading them needs no lock.
Frame frame_of(_PyInterpreterFrame* f) {
  const int lasti = _PyInterpreterFrame_LASTI(f);
  return {reinterpret_cast<PyObject*>(f->f_code), lasti < 0 ? -1 : lasti * static_cast<int>(sizeof(_Py_CODEUNIT))};
}

// Fills `key` from this thread's frames. Returns false when there is no frame,
// or when a code object's verdict is not cached and `gil` is false (the caller
// then retries holding the GIL).
bool current_key(PyThreadState* ts, bool gil, Key* key, bool* need_gil) {
  LibraryCache& cache = library_cache();  // once, not per frame
  *need_gil = false;
  _PyInterpreterFrame* f = ts->cframe ? ts->cframe->current_frame : nullptr;
  while (f && _PyFrame_IsIncomplete(f)) f = f->previous;
  if (!f) return false;
  *key = Key{frame_of(f)};
  for (bool first = true; f; f = f->previous, first = false) {
    if (_PyFrame_IsIncomplete(f)) continue;
    auto* code = reinterpret_cast<PyObject*>(f->f_code);
    bool known = false;
    bool lib = cached_library(code, cache, &known);
    if (!known) {
      if (!gil) {
        *need_gil = true;
        return false;
      }
      lib = classify(code, cache);
    }
    if (!lib) {
      if (!first) key->user = frame_of(f);
      return true;
    }
  }
  return true;  // every frame is library code: name the innermost
}

// Per-thread: (code, offset) -> id for keys the table holds (so the code
// object outlives the entry). A hit takes neither the GIL nor a lock.
using LocalCache = TwoWayCache<Key, int32_t>;

// Not inlined: see library_cache.
__attribute__((noinline)) LocalCache& local_cache() {
  static thread_local LocalCache cache;
  return cache;
}
#endif

// The id of `key` in the table, adding it (with a new reference to its code
// object) when absent; -1 when the table is full. Call with the GIL held.
int32_t intern(const Key& key) {
  LocationTable& t = table();
  auto it = t.ids.find(key);
  if (it != t.ids.end()) return it->second;
  if (t.entries.size() >= kMaxEntries) return -1;
  const auto id = static_cast<int32_t>(t.entries.size());
  Py_INCREF(key.inner.first);  // the entry keeps its code objects (and so their addresses) alive
  Py_XINCREF(key.user.first);
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
  LocalCache& cache = local_cache();
  Key key{{nullptr, 0}};
  bool need_gil = false;
  if (!current_key(ts, false, &key, &need_gil) && !need_gil) return -1;
  if (!need_gil) {
    if (const int32_t* id = cache.find(key, KeyHash()(key))) return *id;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  int32_t id = -1;
  if (!need_gil || current_key(ts, true, &key, &need_gil)) id = intern(key);
  PyGILState_Release(gil);
  if (id >= 0) cache.put(key, KeyHash()(key), id);
  return id;
#else
  PyGILState_STATE gil = PyGILState_Ensure();
  int32_t id = -1;
  if (PyFrameObject* f = PyEval_GetFrame()) {  // borrowed
    Py_INCREF(f);
    Key key{{nullptr, 0}};
    for (bool first = true; f; first = false) {
      PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(f));  // new reference
      const Frame here{code, PyFrame_GetLasti(f)};
      if (first) key.inner = here;
      const bool lib = classify(code, library_cache());
      Py_DECREF(code);  // the table holds its own references
      if (!lib) {
        if (!first) key.user = here;
        Py_DECREF(f);
        f = nullptr;
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(f);  // new reference
      Py_DECREF(f);
      f = back;
    }
    Py_XDECREF(f);
    id = intern(key);
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
    const Key& k = t.entries[id];
    const Frame& f = k.user.first ? k.user : k.inner;  // the user's line when there is one
    auto* code = reinterpret_cast<PyCodeObject*>(f.first);
    if (const char* file = PyUnicode_AsUTF8(code->co_filename)) where = file;
    where += ":" + std::to_string(PyCode_Addr2Line(code, f.second));
  }
  PyGILState_Release(gil);
  return where;
}

}  // namespace

void install_python_location_hooks() { set_location_hooks(&python_location_id, &format_location); }

void set_library_paths(const std::vector<std::string>& prefixes, const std::string& stdlib) {
  PyGILState_STATE gil = PyGILState_Ensure();
  LocationTable& t = table();
  t.library_prefixes = prefixes;
  t.stdlib_prefix = stdlib;
  PyGILState_Release(gil);
}

}  // namespace tpu_eager
