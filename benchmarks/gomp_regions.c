// LD_PRELOAD library of benchmarks/parallel_regions.py: times every OpenMP
// parallel region (GOMP_parallel, which at::parallel_for, oneDNN and MKL all
// enter) per thread, in thread CPU time, while counting is on.
//
// For each region kind (the outlined function the region runs) it sums, over
// the region's calls: the calling thread's CPU time in the region's body, the
// other threads' CPU time in it, the largest thread's (the region's share of
// the critical path), the calling thread's CPU time in the whole call (the
// body plus waking the pool and waiting for it, spinning or in the kernel),
// and the region's wall time. Thread CPU time does not
// grow while a thread waits for a core, so on a loaded machine these sums
// still say how long each thread worked; the region's wall time does not.
// Regions entered from inside another region run as their caller's work.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef void (*region_fn)(void*);
typedef void (*gomp_parallel_fn)(region_fn, void*, unsigned, unsigned);

enum { kMaxThreads = 64, kMaxKinds = 512 };

struct call {
  region_fn fn;
  void* data;
  double cpu_s[kMaxThreads];  // each thread's CPU seconds in this call, by OpenMP thread number
};

struct kind {
  region_fn fn;
  long calls;
  double caller_s, others_s, max_s, call_s, wall_s;
};

static struct kind kinds[kMaxKinds];
static int kind_count;
static int counting;
static __thread int depth;  // > 0 inside a region on this thread

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int thread_num(void) {
  static int (*fn)(void);
  if (!fn) fn = (int (*)(void))dlsym(RTLD_DEFAULT, "omp_get_thread_num");
  return fn ? fn() : 0;
}

// Runs on every thread of the region: its own CPU time around the region's body.
static void timed_body(void* p) {
  struct call* c = p;
  const double start = clock_s(CLOCK_THREAD_CPUTIME_ID);
  depth++;
  c->fn(c->data);
  depth--;
  const int k = thread_num();
  if (k >= 0 && k < kMaxThreads) c->cpu_s[k] = clock_s(CLOCK_THREAD_CPUTIME_ID) - start;
}

static struct kind* kind_of(region_fn fn) {
  for (int i = 0; i < kind_count; ++i)
    if (kinds[i].fn == fn) return &kinds[i];
  if (kind_count == kMaxKinds) return NULL;
  kinds[kind_count].fn = fn;
  return &kinds[kind_count++];
}

void GOMP_parallel(region_fn fn, void* data, unsigned threads, unsigned flags) {
  static gomp_parallel_fn real;
  if (!real) real = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  if (!counting || depth > 0) {
    real(fn, data, threads, flags);
    return;
  }
  struct call c;
  memset(&c, 0, sizeof c);
  c.fn = fn;
  c.data = data;
  const double start = clock_s(CLOCK_MONOTONIC), cpu_start = clock_s(CLOCK_THREAD_CPUTIME_ID);
  depth++;
  real(timed_body, &c, threads, flags);
  depth--;
  const double wall = clock_s(CLOCK_MONOTONIC) - start, call = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu_start;
  struct kind* k = kind_of(fn);
  if (!k) return;
  double others = 0, max = 0;
  for (int t = 0; t < kMaxThreads; ++t) {
    if (t > 0) others += c.cpu_s[t];
    if (c.cpu_s[t] > max) max = c.cpu_s[t];
  }
  k->calls++;
  k->caller_s += c.cpu_s[0];
  k->others_s += others;
  k->max_s += max;
  k->call_s += call;
  k->wall_s += wall;
}

// ---- read from Python (ctypes) ----

void gomp_regions_count(int on) { counting = on; }

void gomp_regions_reset(void) {
  memset(kinds, 0, sizeof kinds);
  kind_count = 0;
}

int gomp_regions_kinds(void) { return kind_count; }

// out: calls, caller_s, others_s, max_s, call_s, wall_s of kind i.
void gomp_regions_get(int i, double* out) {
  out[0] = (double)kinds[i].calls;
  out[1] = kinds[i].caller_s;
  out[2] = kinds[i].others_s;
  out[3] = kinds[i].max_s;
  out[4] = kinds[i].call_s;
  out[5] = kinds[i].wall_s;
}

// "library+0xoffset" of kind i's function (for addr2line).
const char* gomp_regions_where(int i) {
  static char buf[1024];
  Dl_info info;
  if (!dladdr((void*)kinds[i].fn, &info) || !info.dli_fname) return "?";
  snprintf(buf, sizeof buf, "%s+0x%lx", info.dli_fname,
           (unsigned long)((const char*)kinds[i].fn - (const char*)info.dli_fbase));
  return buf;
}
