// On-disk cache files: stamp, lazy load, checked records, locked appends.
#include "device/env.h"
#include "jit/disk_cache.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include "ops/op_table.h"

namespace tpu_eager {
namespace disk_cache {
namespace {

// Bump when the layout of a file or of any table's keys/values changes.
constexpr uint32_t kFormatVersion = 1;
constexpr char kMagic[8] = {'T', 'P', 'U', 'E', 'D', 'C', 'F', '1'};
constexpr uint32_t kRecordMagic = 0x31434552;         // "REC1"
constexpr uint32_t kMaxField = 1u << 20;              // a key or value above 1 MiB is corrupt
constexpr int64_t kMaxFileBytes = int64_t(64) << 20;  // a shape storm must not fill the disk
const char* const kFileNames[2] = {"regions.bin", "meta.bin"};

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 14695981039346656037ULL) {  // FNV-1a 64-bit offset basis
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

struct TableState {
  int fd = -1;
  pid_t pid = 0;  // process that opened fd: a forked child shares its flock and must reopen
  bool loaded = false;
  bool writable = true;
  std::unordered_map<std::string, std::string> entries;
};

enum Warn : unsigned { kWarnUnusable = 1, kWarnCorrupt = 2, kWarnWrite = 4, kWarnFull = 8, kWarnMismatch = 16 };

struct State {
  std::mutex mu;
  std::atomic<int> mode{-1};  // -1: not resolved yet, 0: off, 1: on
  std::string dir;            // as configured
  std::string path;           // dir/stamp
  std::string runtime_tag = "unknown";
  TableState tables[2];
  unsigned warned = 0;
};

State& S() {
  static State* s = new State();  // never destroyed: lookups may run during static destruction
  return *s;
}

void warn_once(unsigned kind, const std::string& msg) {
  State& s = S();
  if (s.warned & kind) return;
  s.warned |= kind;
  TORCH_WARN("torch_tpu_eager disk cache: ", msg);
}

// Identifies this build of the extension: the op table and the shared
// object's size and modification time (changes on every rebuild).
uint64_t build_id() {
  uint64_t h = fnv1a(__DATE__ __TIME__, sizeof(__DATE__ __TIME__));
  for (const auto& e : op_table()) {
    h = fnv1a(e.name, std::strlen(e.name), h);
    const int64_t row[2] = {static_cast<int64_t>(e.kind), static_cast<int64_t>(e.extra_writes)};
    h = fnv1a(row, sizeof(row), h);
  }
  Dl_info info;
  struct stat st;
  if (dladdr(reinterpret_cast<void*>(&build_id), &info) && info.dli_fname && stat(info.dli_fname, &st) == 0) {
    const int64_t f[3] = {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                          static_cast<int64_t>(st.st_mtim.tv_nsec)};
    h = fnv1a(f, sizeof(f), h);
  }
  return h;
}

std::string make_stamp() {
  std::string tag;
  for (char c : S().runtime_tag) tag += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+') ? c : '_';
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(build_id()));
  return "f" + std::to_string(kFormatVersion) + "-torch" + TORCH_VERSION + "-rt" + tag + "-" + id;
}

std::string header_bytes(Table t) {
  const std::string st = stamp();
  std::string h(kMagic, sizeof(kMagic));
  const uint32_t n = static_cast<uint32_t>(st.size()), id = static_cast<uint32_t>(t);
  h.append(reinterpret_cast<const char*>(&n), 4);
  h += st;
  h.append(reinterpret_cast<const char*>(&id), 4);
  return h;
}

std::string record_bytes(const std::string& key, const std::string& value) {
  std::string r;
  const uint32_t head[3] = {kRecordMagic, static_cast<uint32_t>(key.size()), static_cast<uint32_t>(value.size())};
  const uint64_t sum = fnv1a(value.data(), value.size(), fnv1a(key.data(), key.size()));
  r.append(reinterpret_cast<const char*>(head), sizeof(head));
  r.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
  r += key;
  r += value;
  return r;
}

bool write_all(int fd, const std::string& b) {
  size_t done = 0;
  while (done < b.size()) {
    const ssize_t w = ::write(fd, b.data() + done, b.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, std::string* out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  out->assign(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t r = ::pread(fd, &(*out)[done], out->size() - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  out->resize(done);
  return true;
}

int open_table(const std::string& file) { return ::open(file.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644); }

std::string table_file(Table which) { return S().path + "/" + kFileNames[static_cast<int>(which)]; }

// Before an append: reopen the file when this process was forked from the one
// that opened it (flock is shared across fork), or when another process
// replaced it (a repair renamed a new file over it; appends to the old inode
// would be lost). Caller holds mu.
void refresh_fd_locked(Table which) {
  TableState& t = S().tables[static_cast<int>(which)];
  if (t.fd < 0) return;
  struct stat on_disk, open_file;
  const bool replaced = stat(table_file(which).c_str(), &on_disk) != 0 || fstat(t.fd, &open_file) != 0 ||
                        on_disk.st_ino != open_file.st_ino || on_disk.st_dev != open_file.st_dev;
  if (!replaced && t.pid == ::getpid()) return;
  ::close(t.fd);
  t.fd = open_table(table_file(which));
  t.pid = ::getpid();
  if (t.fd < 0) t.writable = false;
}

void close_tables() {
  for (auto& t : S().tables) {
    if (t.fd >= 0) ::close(t.fd);
    t = TableState();
  }
}

// mkdir -p; returns "" or the reason it failed.

// Opens the stamp directory and both table files (not read yet). Caller holds mu.
std::string open_dir_locked(const std::string& dir) {
  State& s = S();
  close_tables();
  s.dir = dir;
  s.path = dir + "/" + stamp();
  std::string err = make_dirs(s.path);
  if (err.empty()) {
    for (int t = 0; t < 2; ++t) {
      s.tables[t].fd = open_table(s.path + "/" + kFileNames[t]);
      s.tables[t].pid = ::getpid();
      if (s.tables[t].fd < 0 && err.empty()) err = s.path + "/" + kFileNames[t] + ": " + std::strerror(errno);
    }
  }
  if (!err.empty()) {
    close_tables();
    s.dir.clear();
    s.path.clear();
  }
  return err;
}

// Reads table `t`'s file once: keeps every valid record; a corrupt or
// truncated file is rewritten to its valid prefix. Caller holds mu.
void load_locked(Table which) {
  State& s = S();
  TableState& t = s.tables[static_cast<int>(which)];
  if (t.loaded || t.fd < 0) return;
  t.loaded = true;
  refresh_fd_locked(which);
  if (t.fd < 0) return;
  if (flock(t.fd, LOCK_EX) != 0) {
    t.writable = false;
    return;
  }
  std::string buf;
  const std::string header = header_bytes(which);
  size_t good = 0;  // bytes of valid header and records
  bool bad = false;
  if (read_all(t.fd, &buf)) {
    if (buf.size() >= header.size() && buf.compare(0, header.size(), header) == 0) {
      good = header.size();
      while (good < buf.size()) {
        uint32_t head[3];
        uint64_t sum;
        if (buf.size() - good < sizeof(head) + sizeof(sum)) break;
        std::memcpy(head, buf.data() + good, sizeof(head));
        std::memcpy(&sum, buf.data() + good + sizeof(head), sizeof(sum));
        const size_t body = good + sizeof(head) + sizeof(sum);
        if (head[0] != kRecordMagic || head[1] > kMaxField || head[2] > kMaxField ||
            buf.size() - body < size_t(head[1]) + head[2])
          break;
        const uint64_t got = fnv1a(buf.data() + body + head[1], head[2], fnv1a(buf.data() + body, head[1]));
        if (got != sum) break;
        t.entries[buf.substr(body, head[1])] = buf.substr(body + head[1], head[2]);  // the last record of a key wins
        good = body + head[1] + head[2];
      }
    }
    bad = good != buf.size() && !buf.empty();
  }
  if (buf.empty()) {
    if (!write_all(t.fd, header)) t.writable = false;
  } else if (bad) {
    warn_once(kWarnCorrupt, std::string(kFileNames[static_cast<int>(which)]) + " in " + s.path +
                                " is corrupt or truncated after byte " + std::to_string(good) +
                                "; the rest of it is ignored and rewritten");
    // Keep the valid prefix: write it to a temporary file and rename it over
    // the damaged one (atomic for readers; the old inode stays locked by us).
    const std::string file = table_file(which);
    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const bool ok = fd >= 0 && write_all(fd, good ? buf.substr(0, good) : header);
    if (fd >= 0) ::close(fd);
    if (ok && ::rename(tmp.c_str(), file.c_str()) == 0) {
      ::close(t.fd);  // releases the lock on the old inode
      t.fd = open_table(file);
      t.pid = ::getpid();
      if (t.fd < 0) t.writable = false;
      return;
    }
    ::unlink(tmp.c_str());
    t.writable = false;  // appending after garbage would be lost to every reader
  }
  flock(t.fd, LOCK_UN);
}

}  // namespace

std::string make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    const std::string part = path.substr(0, i);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return part + ": " + std::strerror(errno);
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path + ": not a directory";
  return "";
}

void set_runtime_tag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().runtime_tag = tag;
}

std::string stamp() {
  static const std::string s = make_stamp();  // runtime_tag is set at import, before any use
  return s;
}

bool enabled() {
  State& s = S();
  const int m = s.mode.load(std::memory_order_acquire);
  if (m >= 0) return m == 1;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.mode.load(std::memory_order_relaxed) < 0) {
    const auto v = env::raw("TORCH_TPU_CACHE_DIR");
    std::string err = v ? open_dir_locked(*v) : "off";
    if (!err.empty() && err != "off")
      warn_once(kWarnUnusable, "TORCH_TPU_CACHE_DIR=" + *v + " is not usable (" + err +
                                   "); compiled regions and meta results stay in memory only");
    s.mode.store(err.empty() ? 1 : 0, std::memory_order_release);
  }
  return s.mode.load(std::memory_order_relaxed) == 1;
}

std::string set_dir(const std::string& dir) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  std::string err;
  if (dir.empty()) {
    close_tables();
    s.dir.clear();
    s.path.clear();
  } else {
    err = open_dir_locked(dir);
  }
  s.mode.store(!dir.empty() && err.empty() ? 1 : 0, std::memory_order_release);
  return err;
}

std::string dir() {
  if (!enabled()) return "";
  std::lock_guard<std::mutex> lock(S().mu);
  return S().dir;
}

bool lookup(Table table, const std::string& key, std::string* value) {
  if (!enabled()) return false;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  load_locked(table);
  const auto& entries = s.tables[static_cast<int>(table)].entries;
  auto it = entries.find(key);
  if (it == entries.end()) return false;
  *value = it->second;
  return true;
}

void reject(Table table, const std::string& why) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  warn_once(kWarnMismatch, std::string(kFileNames[static_cast<int>(table)]) + " in " + s.path +
                               " has an entry that does not match its key (" + why +
                               "); it is rejected, recompiled and replaced");
}

bool store(Table table, const std::string& key, const std::string& value) {
  if (!enabled() || key.size() > kMaxField || value.size() > kMaxField) return false;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  load_locked(table);
  TableState& t = s.tables[static_cast<int>(table)];
  auto known = t.entries.find(key);
  if (!t.writable || t.fd < 0 || (known != t.entries.end() && known->second == value)) return false;
  refresh_fd_locked(table);
  if (t.fd < 0) return false;
  const std::string rec = record_bytes(key, value);
  if (flock(t.fd, LOCK_EX) != 0) return false;
  struct stat st;
  bool ok = false;
  const bool stat_ok = fstat(t.fd, &st) == 0;
  if (stat_ok && st.st_size == 0 && !write_all(t.fd, header_bytes(table))) {
    // A file deleted under us was recreated empty: it needs its header first.
    warn_once(kWarnWrite, "cannot write to " + s.path + " (" + std::strerror(errno) + "); new entries stay in memory");
    t.writable = false;
  } else if (stat_ok && st.st_size + static_cast<int64_t>(rec.size()) > kMaxFileBytes) {
    warn_once(kWarnFull,
              s.path + " reached " + std::to_string(kMaxFileBytes >> 20) + " MiB; new entries stay in memory");
    t.writable = false;
  } else if (write_all(t.fd, rec)) {
    ok = true;
  } else {
    warn_once(kWarnWrite, "cannot append to " + s.path + " (" + std::strerror(errno) + "); new entries stay in memory");
    t.writable = false;
  }
  flock(t.fd, LOCK_UN);
  if (ok) t.entries[key] = value;
  return ok;
}

}  // namespace disk_cache
}  // namespace tpu_eager
