// Optional on-disk cache (TORCH_TPU_CACHE_DIR) behind the in-memory caches:
// compiled regions (jit.cpp) and meta-inference outcomes (ops/record.cpp).
//
// Layout: <dir>/<stamp>/{regions,meta}.bin, where the stamp names the file
// format, the torch version and a build id of this extension, so a cache
// written by another build is never read. Each file is a header (magic,
// stamp) followed by append-only records (length-prefixed key and value with
// an FNV-1a checksum); appends hold an flock, so concurrent processes never
// interleave records. A table's file is read lazily, once per process, at the
// first lookup in that table. A corrupt or truncated file gives a one-time
// warning: its valid prefix is kept (rewritten to a temporary file and
// atomically renamed) and the rest is ignored. A well-formed entry that does
// not fit its key gives a one-time warning too (reject). A directory that cannot be
// written gives a one-time warning and the caches stay in memory only.
#pragma once

#include <string>

namespace tpu_eager {
namespace disk_cache {

enum class Table : int { kRegions = 0, kMeta = 1 };

// True when a usable cache directory is configured. The first call reads
// TORCH_TPU_CACHE_DIR unless set_dir() was called first. Cheap after that.
bool enabled();

// Looks `key` up in `table`; fills `value` and returns true on a hit.
// Returns false when disabled or absent. Keys and values are opaque bytes;
// callers make keys stable across processes (no addresses).
bool lookup(Table table, const std::string& key, std::string* value);

// A value found under a key that its reader cannot use (it does not decode,
// or describes another region or op than the key's): gives a one-time
// warning naming the table; the caller then recompiles (or re-infers) and
// stores the right value, which replaces it.
void reject(Table table, const std::string& why);

// Appends (key, value) to `table`'s file; returns true when written. A key
// already stored with another value (one its reader rejected) is replaced:
// the last record of a key wins when a file is read.
bool store(Table table, const std::string& key, const std::string& value);

// Sets the directory ("" turns the disk cache off) and drops what was loaded.
// Returns "" when the directory is usable, else the reason it is not (the
// disk cache is then off); no warning is printed for this call.
std::string set_dir(const std::string& dir);

// The directory in use ("" when off) and the version stamp of this build.
std::string dir();
std::string stamp();

// Creates `path` and its missing parents (mkdir -p); "" on success, else the
// first part that could not be made, with the reason.
std::string make_dirs(const std::string& path);

// The runtime torch.__version__, given by the Python package at import; part of the stamp.
void set_runtime_tag(const std::string& tag);

}  // namespace disk_cache
}  // namespace tpu_eager
