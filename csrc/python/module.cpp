// pybind11 bindings of torch_tpu_eager._C (the only translation unit that
// includes the heavy Python/torch headers).
#include <Python.h>
#include <frameobject.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include "device/env.h"
#include "lazy/debug_report.h"
#include "device/autograd_threads.h"
#include "device/block_cache.h"
#include "device/device.h"
#include "device/fork.h"
#include "device/host_share.h"
#include "distributed/collective_clock.h"
#include "executors/cpu_features.h"
#include "executors/executor.h"
#include "executors/out_variant.h"
#include "executors/spyre/card.h"
#include "executors/spyre/convert16.h"
#include "executors/spyre/df16.h"
#include "executors/spyre/job_plan.h"
#include "executors/spyre/ktir.h"
#include "executors/spyre/ktir_ir.h"
#include "executors/spyre/schedule.h"
#include "executors/spyre/spyre.h"
#include "executors/tpu/chip.h"
#include "executors/tpu/cost_model.h"
#include "executors/tpu/fused_program.h"
#include "executors/tpu/tiling.h"
#include "jit/disk_cache.h"
#include "jit/dynamic_shapes.h"
#include "jit/flush_cache.h"
#include "jit/jit.h"
#include "jit/verify.h"
#include "jit/kernel_trace.h"
#include "lazy/async_errors.h"
#include "lazy/queue.h"
#include "ops/memory_format.h"
#include "ops/cpu_probe.h"
#include "ops/op_table.h"
#include "ops/record.h"
#include "python/custom_ops.h"
#include "python/location.h"
#include "views/view_chain.h"

namespace py = pybind11;
using namespace tpu_eager;

namespace {

py::dict metrics_dict() {
  Metrics m = metrics_snapshot();
  py::dict d;
  d["ops_recorded"] = m.ops_recorded;
  d["ops_executed"] = m.ops_executed;
  d["ops_eliminated"] = m.ops_eliminated;
  d["eager_ops"] = m.eager_ops;
  d["fallback_ops"] = m.fallback_ops;
  d["flushes"] = m.flushes;
  py::dict reasons;
  for (int r = 0; r < static_cast<int>(FlushReason::kCount); ++r)
    if (m.flush_reasons[r] > 0) reasons[flush_reason_name(static_cast<FlushReason>(r))] = m.flush_reasons[r];
  d["flush_reasons"] = reasons;
  d["regions_run"] = m.regions_run;
  d["ops_per_region"] = m.regions_run ? static_cast<double>(m.ops_executed) / static_cast<double>(m.regions_run) : 0.0;
  d["library_calls"] = m.library_calls;
  d["output_copies"] = m.output_copies;
  d["cache_hits"] = m.cache_hits;
  d["flush_cache_hits"] = m.flush_cache_hits;
  d["flush_cache_size"] = static_cast<int64_t>(jit::flush_cache_size());
  d["flush_cache_limit"] = static_cast<int64_t>(jit::flush_cache_limit());
  d["compiles"] = m.compiles;
  d["plans_built"] = m.plans_built;
  d["kernel_cache_evictions"] = m.kernel_cache_evictions;
  d["kernel_cache_size"] = static_cast<int64_t>(jit::cache_size());
  d["kernel_cache_limit"] = static_cast<int64_t>(jit::cache_limit());
  d["bytes_materialized"] = m.bytes_materialized;
  d["bytes_read"] = m.bytes_read;
  d["padding_bytes"] = m.padding_bytes;
  d["flops"] = m.flops;
  d["sim_time_s"] = m.sim_time_s;
  d["schedule_time_s"] = m.schedule_time_s;
  d["collectives"] = m.collectives;
  d["collective_time_s"] = m.collective_time_s;
  d["compile_time_s"] = m.compile_time_s;
  d["cpu_probes"] = cpu_probe_counts()[0];        // dtype probes of CPU's kernels on twins (a first-step cost)
  d["twin_inferences"] = twin_inference_count();  // shapes by CPU's kernel on twins (likewise)
  d["disk_cache_hits"] = m.disk_cache_hits;
  d["disk_cache_misses"] = m.disk_cache_misses;
  d["disk_cache_writes"] = m.disk_cache_writes;
  const HostShareStats hs = host_share_stats();
  d["host_reads_shared"] = hs.reads;
  d["bytes_shared"] = hs.bytes;
  d["cow_copies"] = hs.cow_copies;
  d["cow_bytes"] = hs.cow_bytes;
  return d;
}

// A kernel's tiling as a dict (None without a plan).
py::object tiling_dict(const jit::TilingRecord& t) {
  if (t.kind.empty()) return py::none();
  py::dict d;
  d["kind"] = t.kind;
  if (!t.order.empty()) d["order"] = t.order;
  d["grid"] = t.grid;
  d["block"] = t.block;
  py::list blocks;
  for (const auto& b : t.blocks) {
    py::dict e;
    e["role"] = b.role;
    e["dtype"] = b.dtype;
    e["shape"] = b.shape;
    e["block"] = b.block;
    e["buffers"] = b.buffers;
    e["vmem_bytes"] = b.vmem_bytes;
    blocks.append(e);
  }
  d["blocks"] = blocks;
  d["vmem_bytes"] = t.vmem_bytes;
  d["vmem_budget_bytes"] = t.vmem_budget_bytes;
  d["hbm_reread_bytes"] = t.hbm_reread_bytes;
  d["mxu_utilization"] = t.mxu_utilization < 0 ? py::object(py::none()) : py::object(py::float_(t.mxu_utilization));
  return d;
}

py::dict kernel_dict(const jit::KernelRecord& r) {
  py::dict d;
  d["name"] = r.name;
  d["target"] = r.target;
  d["ops"] = r.ops;
  d["shapes"] = r.shapes;
  d["output_shapes"] = r.output_shapes;
  d["bytes_read"] = r.stats.bytes_read;
  d["bytes_written"] = r.stats.bytes_written;
  d["padding_bytes"] = r.stats.padding_bytes;
  d["flops"] = r.stats.flops;
  d["mxu_flops"] = r.stats.mxu_flops;
  d["compute_s"] = r.stats.compute_s;
  d["memory_s"] = r.stats.memory_s;
  d["sim_time_s"] = r.stats.sim_time_s;
  d["start_s"] = r.start_s;
  d["cache_hit"] = r.cache_hit;
  d["failed"] = r.failed;
  d["tiling"] = tiling_dict(r.tiling);
  d["kind"] = r.kind;
  if (r.kind == "collective") {
    const auto& c = r.collective;
    py::dict cd;
    cd["algorithm"] = c.algorithm;
    cd["group_size"] = c.group_size;
    cd["nbytes"] = c.nbytes;
    cd["shape"] = py::tuple(py::cast(c.shape));
    cd["bytes_per_link"] = c.bytes_per_link;
    cd["hops"] = c.hops;
    cd["latency_s"] = c.latency_s;
    cd["bandwidth_s"] = c.bandwidth_s;
    d["collective"] = cd;
  } else {
    d["collective"] = py::none();
  }
  return d;
}

// Sets the active chip from the dict built by torch_tpu_eager.target: runs
// pending work on the old chip first, then drops regions compiled for it.
void set_target(const py::dict& p) {
  tpu::ChipParams c;
  c.name = p["name"].cast<std::string>();
  c.tensor_cores = p["tensor_cores"].cast<int64_t>();
  c.mxus_per_core = p["mxus_per_core"].cast<int64_t>();
  c.mxu_size = p["mxu_size"].cast<int64_t>();
  c.sublanes = p["sublanes"].cast<int64_t>();
  c.lanes = p["lanes"].cast<int64_t>();
  c.peak_bf16_flops = p["peak_bf16_flops"].cast<double>();
  c.hbm_bandwidth = p["hbm_bandwidth"].cast<double>();
  c.hbm_bytes = p["hbm_bytes"].cast<int64_t>();
  c.vmem_bytes = p["vmem_bytes"].cast<int64_t>();
  c.vpu_elems_per_s = p["vpu_elems_per_s"].cast<double>();
  c.launch_s = p["launch_s"].cast<double>();
  TORCH_CHECK_VALUE(c.valid() && c.mxu_size > 0 && c.sublanes > 0 && c.lanes > 0 && c.hbm_bytes > 0,
                    "invalid chip parameters for target ", c.name);
  py::gil_scoped_release no_gil;
  (void)flush_all(FlushReason::kTargetSwitch);  // errors stay with the storages they poisoned
  tpu::set_active_chip(c);
  set_active_target_kind(TargetKind::kTpu);
  set_memory_capacity(c.hbm_bytes, c.name);
  jit::clear_cache();
}

// The same for the Spyre card (dict built from targets/spyre.json).
void set_spyre_target(const py::dict& p) {
  spyre::CardParams c;
  c.name = p["name"].cast<std::string>();
  c.cores = p["cores"].cast<int64_t>();
  c.corelets_per_core = p["corelets_per_core"].cast<int64_t>();
  c.lx_bytes_per_core = p["lx_bytes_per_core"].cast<int64_t>();
  c.lx_usable_bytes_per_core = p["lx_usable_bytes_per_core"].cast<int64_t>();
  c.dram_bytes = p["dram_bytes"].cast<int64_t>();
  c.stick_bytes = p["stick_bytes"].cast<int64_t>();
  c.matmul_macs_per_s_per_core = p["matmul_macs_per_s_per_core"].cast<double>();
  c.vector_elems_per_s_per_core = p["vector_elems_per_s_per_core"].cast<double>();
  c.dram_bandwidth = p["dram_bandwidth"].cast<double>();
  c.overlap = p["overlap"].cast<double>();
  if (p.contains("ring_link_bandwidth")) c.ring_link_bandwidth = p["ring_link_bandwidth"].cast<double>();
  if (p.contains("ring_hop_latency_s")) c.ring_hop_latency_s = p["ring_hop_latency_s"].cast<double>();
  TORCH_CHECK_VALUE(c.valid() && c.dram_bytes > 0, "invalid card parameters for target ", c.name);
  py::gil_scoped_release no_gil;
  (void)flush_all(FlushReason::kTargetSwitch);
  spyre::set_active_card(c);
  set_active_target_kind(TargetKind::kSpyre);
  set_memory_capacity(c.dram_bytes, c.name);
  jit::clear_cache();
}

// torch::PyTorchError is how a C++ error reaches Python as a given builtin
// type through torch's HANDLE_TH_ERRORS; c10 has no OverflowError.
struct SpyreOverflowError : torch::PyTorchError {
  using torch::PyTorchError::PyTorchError;
  PyObject* python_type() override { return PyExc_OverflowError; }
};
[[noreturn]] void throw_spyre_overflow(const std::string& msg) { throw SpyreOverflowError(msg); }

py::dict chip_dict() {
  tpu::ChipParams c = tpu::active_chip();
  py::dict d;
  d["name"] = c.name;
  d["tensor_cores"] = c.tensor_cores;
  d["mxus_per_core"] = c.mxus_per_core;
  d["mxu_size"] = c.mxu_size;
  d["sublanes"] = c.sublanes;
  d["lanes"] = c.lanes;
  d["peak_bf16_flops"] = c.peak_bf16_flops;
  d["hbm_bandwidth"] = c.hbm_bandwidth;
  d["hbm_bytes"] = c.hbm_bytes;
  d["vmem_bytes"] = c.vmem_bytes;
  d["vpu_elems_per_s"] = c.vpu_elems_per_s;
  d["launch_s"] = c.launch_s;
  return d;
}

py::dict schedule_dict(const spyre::Schedule& s) {
  py::dict d;
  d["kernel"] = s.kernel;
  d["cores"] = s.cores;
  d["cores_used"] = s.cores_used;
  d["corelets"] = s.corelets;
  d["rows"] = s.rows;
  d["rows_per_core"] = s.rows_per_core;
  d["n_tiles"] = s.n_tiles;
  d["tile_rows"] = s.tile_rows;
  d["row_split"] = s.row_split;
  d["corelet_split"] = s.corelet_split;
  d["corelet_share"] = s.corelet_share;
  d["buffers"] = s.buffers;
  d["lx_budget_bytes"] = s.lx_budget_bytes;
  d["lx_bytes_used"] = s.lx_bytes_used;
  py::list views;
  for (const auto& v : s.views) {
    py::dict e;
    e["id"] = v.id;
    e["space"] = v.lx ? "LX" : "HBM";
    e["loaded"] = v.loaded;
    e["stored"] = v.stored;
    e["split"] = v.split;
    e["tile_sizes"] = v.tile_sizes;
    e["tile_sticks"] = v.tile_sticks;
    e["tile_bytes"] = v.tile_bytes;
    views.append(e);
  }
  d["views"] = views;
  d["load_bytes_per_tile"] = s.load_bytes_per_tile;
  d["store_bytes_per_tile"] = s.store_bytes_per_tile;
  d["ring_steps"] = s.ring_steps;
  d["ring_bytes"] = s.ring_bytes;
  d["ring_cycles"] = s.ring_cycles;
  d["partial_bytes"] = s.partial_bytes;
  d["compute_s"] = s.compute_s;
  d["memory_s"] = s.memory_s;
  d["tile_load_s"] = s.tile_load_s;
  d["tile_compute_s"] = s.tile_compute_s;
  d["tile_store_s"] = s.tile_store_s;
  d["fill_s"] = s.fill_s;
  d["steady_s"] = s.steady_s;
  d["drain_s"] = s.drain_s;
  d["pipelined_s"] = s.pipelined_s;
  d["calibrated_s"] = s.calibrated_s;
  py::list stages;
  for (const auto& st : s.stages) {
    py::dict e;
    e["kind"] = st.kind;
    e["tile"] = st.tile;
    e["buffer"] = st.buffer;
    e["bytes"] = st.bytes;
    e["start_s"] = st.start_s;
    e["end_s"] = st.end_s;
    stages.append(e);
  }
  d["stages"] = stages;
  d["stages_omitted"] = s.stages_omitted;
  d["executed"] = s.executed_tiles ? "tiles" : "whole";
  d["whole_reason"] = s.whole_reason;
  d["tile_steps"] = s.tile_steps;
  d["ring_steps_run"] = s.ring_steps_run;
  d["executed_s"] = s.executed_s;
  d["ring_s"] = s.ring_s;
  d["ring_latency_s"] = s.ring_latency_s;
  py::list cores;
  for (const auto& t : s.per_core) {
    py::dict e;
    e["core"] = t.core;
    e["rows"] = t.rows;
    e["tiles"] = t.tiles;
    e["load_s"] = t.load_s;
    e["compute_s"] = t.compute_s;
    e["store_s"] = t.store_s;
    e["end_s"] = t.end_s;
    e["overlap_s"] = t.overlap_s;
    cores.append(e);
  }
  d["per_core"] = cores;
  d["text"] = spyre::schedule_text(s);
  return d;
}

py::dict job_plan_dict(const spyre::JobPlan& p) {
  py::list args, steps;
  for (const auto& a : p.args) {
    py::dict e;
    e["symbol"] = a.symbol;
    e["dtype"] = a.dtype;
    e["numel"] = a.numel;
    e["sizes"] = a.sizes;
    e["stick_elems"] = a.stick_elems;
    e["sticks"] = a.sticks;
    e["bytes"] = a.bytes;
    e["address"] = a.address;
    args.append(e);
  }
  for (const auto& s : p.steps) {
    py::dict e;
    e["kind"] = s.kind;
    if (s.kind == "Compute") {
      e["kernel"] = s.kernel;
      e["region"] = s.region;
      e["reads"] = s.reads;
      e["writes"] = s.writes;
      py::dict binding;
      for (const auto& [name, value] : s.binding) binding[py::str(name)] = value;
      e["binding"] = binding;
      e["program"] = s.program;
      e["programs"] = s.programs;
    } else {
      e["arg"] = s.arg;
      e["bytes"] = s.bytes;
    }
    steps.append(e);
  }
  py::dict d;
  d["args"] = args;
  d["steps"] = steps;
  d["device_bytes"] = p.device_bytes;
  return d;
}

// Runs `flush` (which returns the error to raise, or nullptr) with the GIL
// released. The C++ warnings its kernels give (TORCH_WARN) reach Python's
// warnings module, as those of an ATen call do through torch's
// HANDLE_TH_ERRORS, instead of c10's default handler printing them to stderr.
template <typename F>
void flush_with_python_warnings(F&& flush) {
  torch::PyWarningHandler warnings;
  try {
    std::exception_ptr err;
    {
      py::gil_scoped_release no_gil;
      err = flush();
    }
    if (err) std::rethrow_exception(err);
  } catch (...) {
    warnings.set_in_exception();  // its destructor must not throw while this propagates
    throw;
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu_eager native core: PrivateUse1 device, DeferAndFuse queue, JIT, executors";
  m.def("_register_kernels", &register_device_kernels, "Registers the op table's kernels; returns the overload count.");
  m.def("_install_location_hook", [] { install_python_location_hooks(); });
  m.def("_set_library_paths", &set_library_paths, "Path prefixes of library code for source locations.");
  m.def("_is_in_bad_fork", &in_bad_fork, "True in a process forked after its parent used the device.");
  // torch.tpu.init() / is_initialized(), as CUDA's: init raises in a bad fork, else marks the device used.
  m.def("_init", []() {
    check_not_in_bad_fork();
    note_device_used();
  });
  m.def("_is_initialized", &device_initialized);
  m.def(
      "_drain_autograd_device_thread",
      [](int index) {
        py::gil_scoped_release no_gil;  // the engine runs only without the GIL; the thread may need it
        drain_autograd_device_thread(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
      },
      py::arg("index"), "Waits until autograd's worker thread of tpu:<index> finished its queued tasks.");
  m.def("_in_device_meta_inference", &in_device_meta_inference,
        "True while the record kernel runs a meta kernel on this thread (meta_hints.py).");
  m.def(
      "_flush",
      [](int reason, bool raise_error) {
        flush_with_python_warnings([&] {
          std::exception_ptr err = flush_all(static_cast<FlushReason>(reason), raise_error);
          return raise_error ? err : nullptr;
        });
      },
      py::arg("reason"), py::arg("raise_error") = true);
  m.def(
      "_env_knobs",
      [] {
        static const char* kTypes[] = {"bool", "int", "string", "path"};
        py::list out;
        for (const env::Knob& k : env::knobs())
          out.append(py::make_tuple(k.name, kTypes[static_cast<int>(k.type)], k.default_value, k.where, k.doc));
        return out;
      },
      "Every environment knob: (name, type, default, where it is read, doc).");
  m.def("_debug_level", &debug::level);
  // Recompile warnings (debug::on_compile) as Python warnings of category `cls`.
  m.def(
      "_set_recompile_warning",
      [](py::object cls) {
        static PyObject* category = nullptr;  // kept for the life of the process
        Py_XDECREF(category);
        category = cls.release().ptr();
        debug::set_warn_hook([](const std::string& msg, const std::string& file, int line) {
          if (!Py_IsInitialized()) return;
          PyGILState_STATE gil = PyGILState_Ensure();
          PyObject *type, *value, *tb;
          PyErr_Fetch(&type, &value, &tb);
          // Issued inside a flush, which cannot raise: a filter that turns it
          // into an error reports it as unraisable instead.
          if (PyErr_WarnExplicit(category, msg.c_str(), file.c_str(), line, nullptr, nullptr) < 0)
            PyErr_WriteUnraisable(category);
          PyErr_Restore(type, value, tb);
          PyGILState_Release(gil);
        });
      },
      "Issues recompile warnings as Python warnings of category `cls` (a Warning subclass).");
  m.def(
      "_timers",
      [] {
        py::dict out;
        for (const auto& [name, t] : debug::timers())
          out[py::str(name)] = py::make_tuple(t.count, t.total_s, t.samples);
        return out;
      },
      "Timers of metrics_report(): name -> (count, total seconds, a sample of durations in seconds).");
  m.def("_flushes_by_line", &debug::flushes_by_line, "Flushes per triggering Python 'file:line'.");
  m.def("_reset_debug_report", &debug::reset);
  m.def("_op_counts", &debug::op_counts, "Calls per 'category.op' (cpu_fallback, library_call).");
  m.def("_env_validate", &env::validate_all, "Raises ValueError naming the first malformed knob that is set.");
  m.def("_env_bool", [](const std::string& n) { return env::get_bool(n.c_str()); });
  m.def("_env_int", [](const std::string& n) { return env::get_int(n.c_str()); });
  m.def("_env_string", [](const std::string& n) { return env::get_string(n.c_str()); });
  m.def(
      "_flush_device",
      [](int device, int reason) {
        flush_with_python_warnings(
            [&] { return synchronize_errors(checked_device(device), static_cast<FlushReason>(reason)); });
        // torch.tpu.synchronize waits for every stream of the chip.
        if (static_cast<FlushReason>(reason) == FlushReason::kSynchronize) host_waited_for_chip(checked_device(device));
      },
      py::arg("device"), py::arg("reason"));
  m.def("_chip_sim_time", [](int device) { return chip_sim_time(checked_device(device)); });
  // A collective's simulated ICI time on a chip's timeline (torch_tpu_eager.ici.record_collective).
  m.def(
      "_record_collective",
      [](int device, const std::string& op, const std::string& target, double seconds, const std::string& algorithm,
         int64_t group_size, int64_t nbytes, std::vector<int64_t> shape, double bytes_per_link, int64_t hops,
         double latency_s, double bandwidth_s) {
        jit::CollectiveRecord info;
        info.algorithm = algorithm;
        info.group_size = group_size;
        info.nbytes = nbytes;
        info.shape = std::move(shape);
        info.bytes_per_link = bytes_per_link;
        info.hops = hops;
        info.latency_s = latency_s;
        info.bandwidth_s = bandwidth_s;
        py::gil_scoped_release no_gil;  // the flush may wait for the autograd thread's ops
        return distributed::record_collective(checked_device(device), op, target, seconds, info);
      },
      py::arg("device"), py::arg("op"), py::arg("target"), py::arg("seconds"), py::arg("algorithm"),
      py::arg("group_size"), py::arg("nbytes"), py::arg("shape"), py::arg("bytes_per_link"), py::arg("hops"),
      py::arg("latency_s"), py::arg("bandwidth_s"));
  // torch.tpu.precision: this thread's scoped float32 matmul precision (-1: none; device.h).
  m.def("_thread_precision", []() { return thread_precision(); });
  m.def("_set_thread_precision", [](int p) { set_thread_precision(p); });
  m.def("_metrics", &metrics_dict);
  m.def("_reset_metrics", [] {
    reset_metrics();
    reset_host_share_stats();
  });
  m.def("_set_eager_mode", [](int mode) { set_eager_mode(static_cast<EagerMode>(mode)); });
  m.def("_eager_mode", [] { return static_cast<int>(eager_mode()); });
  m.def("_pending_ops", [] { return pending_ops(); });
  m.def("_set_queue_limits", &set_queue_limits, py::arg("max_ops"), py::arg("max_bytes"));
  m.def("_queue_limits", &queue_limits);
  m.def("_set_fused_math", [](bool cpu) {
    tpu::fused::set_math_routines(cpu ? tpu::fused::MathRoutines::kCpu : tpu::fused::MathRoutines::kSleef);
  });
  m.def("_set_stream_store_threshold", &tpu::fused::set_stream_store_threshold, py::arg("bytes"));
  m.def("_stream_store_threshold", &tpu::fused::stream_store_threshold);
  m.def("_fused_math_is_cpu", [] { return tpu::fused::math_routines() == tpu::fused::MathRoutines::kCpu; });
  m.def("_cache_size", &jit::cache_size);
  m.def("_mark_dynamic", [](const at::Tensor& t, int64_t dim, int64_t lower, int64_t upper) {
    jit::mark_dynamic(deferred_storage_of(t), t.dim(), dim, lower, upper, t.size(dim), t.stride(dim));
  });
  m.def("_clear_cache", &jit::clear_cache);
  m.def("_set_kernel_cache_limit", &jit::set_cache_limit);
  m.def("_set_flush_cache_limit", &jit::set_flush_cache_limit);
  m.def(
      "_flush_work_counts",
      [] {
        const jit::FlushWorkCounts c = jit::flush_work_counts();
        py::dict d;
        d["structure_words"] = c.structure_words;
        d["per_tensor_nodes_written"] = c.per_tensor_nodes_written;
        d["per_tensor_nodes_refreshed"] = c.per_tensor_nodes_refreshed;
        d["storage_error_reads"] = c.storage_error_reads;
        return d;
      },
      "Test hook: the last flush's structure words, the foreach per-tensor nodes written whole / refreshed, "
      "the storages' error fields the regions read.");
  m.def("_jit_set_verify", &jit::set_verify, "Verifies every flush's regions (jit/verify.h) when True.");
  m.def("_jit_verify_enabled", &jit::verify_enabled);
  m.def("_jit_break_next_partition", &jit::set_break_next_partition,
        "Test hook: corrupts the next flush's regions once (1 order, 2 materialize, 3 anchor).");
  m.def("_set_cache_dir", &disk_cache::set_dir, py::arg("dir"));
  m.def("_cache_dir", &disk_cache::dir);
  m.def("_cache_stamp", &disk_cache::stamp);
  m.def("_set_cache_runtime_tag", &disk_cache::set_runtime_tag, py::arg("tag"));
  m.def("_set_target", &set_target, py::arg("params"));
  m.def("_chip", &chip_dict);
  // Tiling plans on the active chip without running anything (tests, what-if tables).
  m.def(
      "_plan_matmul",
      [](int64_t m_, int64_t k, int64_t n, int64_t batch, at::ScalarType ta, at::ScalarType tb, at::ScalarType tout) {
        const tpu::ChipParams chip = tpu::active_chip();
        tpu::MatmulProblem p;
        p.gemm = {double(batch), double(m_), double(k), double(n)};
        p.ta = ta;
        p.tb = tb;
        p.tout = tout;
        p.a_bytes = tpu::tiled_bytes({batch, m_, k}, ta, chip);
        p.b_bytes = tpu::tiled_bytes({batch, k, n}, tb, chip);
        return tiling_dict(tpu::tiling_record(tpu::plan_matmul(p, chip)));
      },
      py::arg("m"), py::arg("k"), py::arg("n"), py::arg("batch"), py::arg("ta"), py::arg("tb"), py::arg("tout"));
  m.def(
      "_plan_vector",
      [](const std::vector<std::tuple<std::vector<int64_t>, at::ScalarType, std::string>>& operands) {
        std::vector<tpu::PlanOperand> ops;
        for (const auto& [sizes, dtype, role] : operands) ops.push_back({sizes, dtype, role});
        return tiling_dict(tpu::tiling_record(tpu::plan_vector(ops, tpu::active_chip())));
      },
      py::arg("operands"));
  m.def("_set_spyre_target", &set_spyre_target, py::arg("params"));
  m.def("_target_name", [] {
    return active_target_kind() == TargetKind::kSpyre ? spyre::active_card().name : tpu::active_chip().name;
  });
  spyre::set_overflow_thrower(&throw_spyre_overflow);
  m.def("_ktir_last", &spyre::last_flush_ktir);
  // KTIR text tools (executors/spyre/ktir_ir.h): round trip, verifier, interpreter.
  m.def("_ktir_format", [](const std::string& text) { return spyre::ktir_print(spyre::ktir_parse(text)); });
  m.def("_ktir_verify",
        [](const std::string& text) { spyre::ktir_verify(spyre::ktir_parse(text), spyre::active_card()); });
  m.def("_ktir_run", [](const std::string& text, std::vector<at::Tensor> tensors) {
    py::gil_scoped_release no_gil;
    return spyre::ktir_run(spyre::ktir_parse(text), spyre::active_card(), std::move(tensors));
  });
  m.def("_corelet_shares", &spyre::corelet_shares, py::arg("rows"), py::arg("corelets"));
  m.def("_schedule_last", [] {
    py::list out;
    for (const auto& s : spyre::last_flush_schedules()) out.append(schedule_dict(s));
    return out;
  });
  m.def("_job_plan_last", [] { return job_plan_dict(spyre::last_job_plan()); });
  m.def("_memory_capacity", &memory_capacity);
  m.def("_trace_begin", [] { return jit::trace_begin(); });
  m.def("_trace_end", [](size_t first) {
    py::list out;
    for (const auto& r : jit::trace_end(first)) out.append(kernel_dict(r));
    return out;
  });
  m.def("_trace_active", &jit::trace_active);
  m.def("_trace_size", &jit::trace_size);
  m.def("_memory_allocated", &memory_allocated);
  m.def("_max_memory_allocated", &max_memory_allocated);
  m.def("_empty_cache", &block_cache_release);
  m.def("_cached_bytes", &block_cache_bytes);
  m.def("_live_padding_bytes", &block_live_padding);
  m.def("_reset_peak_memory_stats", &reset_peak_memory_stats);
  // Chips and the current chip (torch_tpu_eager/device.py checks argument types).
  m.def("_memory_reserved", &memory_reserved);
  m.def("_max_memory_reserved", &max_memory_reserved);
  m.def("_device_count", [] { return device_count(); });
  m.def("_set_device_count", &set_device_count);
  m.def("_checked_device", &checked_device);
  m.def("_current_device", [] { return static_cast<int>(current_device_index()); });
  m.def("_set_device", [](int d) {
    c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->setDevice(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d)));
  });
  m.def("_default_generator", [](int index) { return default_device_generator(static_cast<c10::DeviceIndex>(index)); });
  m.def("_op_table", [] {
    py::list rows;
    for (const auto& e : op_table()) rows.append(py::make_tuple(e.name, prim_kind_name(e.kind)));
    return rows;
  });
  // The meta cache (interned meta keys, Node::meta_id): entries, ids given, bound.
  m.def("_meta_cache_stats", [] {
    const MetaCacheStats st = meta_cache_stats();
    py::dict d;
    d["entries"] = static_cast<int64_t>(st.entries);
    d["last_id"] = static_cast<int64_t>(st.last_id);
    d["limit"] = static_cast<int64_t>(st.limit);
    return d;
  });
  m.def("_set_meta_cache_limit", [](int64_t limit) {
    if (limit < 1) throw py::value_error("meta cache limit must be at least 1, got " + std::to_string(limit));
    set_meta_cache_limit(static_cast<size_t>(limit));
  });
  m.def("_hand_written_kernels", [] {
    std::vector<std::string> names(hand_written_kernels().begin(), hand_written_kernels().end());
    std::sort(names.begin(), names.end());
    return names;
  });
  m.def(
      "_out_overload",
      [](const std::string& qualname) -> py::object {
        auto dot = qualname.find('.');
        auto h = c10::Dispatcher::singleton().findOp(
            c10::OperatorName(qualname.substr(0, dot), dot == std::string::npos ? "" : qualname.substr(dot + 1)));
        if (!h || !h->hasSchema()) throw py::value_error("no registered operator " + qualname);
        const c10::OperatorHandle* out = host::out_variant(*h);
        return out ? py::cast(out->operator_name().overload_name) : py::none();
      },
      py::arg("qualname"),
      "Overload name of the out= overload region runs use for the functional op 'ns::name[.overload]', or None.");
  m.def("_storage_has_pending", [](const at::Tensor& t) { return storage_has_pending(deferred_storage_of(t)); });
  m.def("_prepare_address_export", [](const at::Tensor& t) {
    py::gil_scoped_release no_gil;  // a flush may wait for the autograd thread's ops
    prepare_address_export(t);
  });
  // View decomposition, exposed for tests and inspection.
  m.def("_view_chain",
        [](int64_t storage_numel, std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset) {
          auto c = views::decompose(storage_numel, sizes, strides, offset);
          return py::make_tuple(c.str(), c.gather, c.padded);
        });
  m.def("_view_apply",
        [](const at::Tensor& flat, std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset) {
          return views::apply(flat, views::decompose(flat.numel(), sizes, strides, offset), sizes, strides, offset);
        });
  m.def("_view_scatter", [](at::Tensor flat, std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset,
                            const at::Tensor& value) {
    views::scatter(flat, views::decompose(flat.numel(), sizes, strides, offset), sizes, strides, offset, value);
  });
  // Spyre df16 codec (torch_tpu_eager/spyre.py checks arguments and devices).
  m.def(
      "_df16_encode",
      [](const at::Tensor& x, bool nearest_even, bool saturate) {
        using spyre::Df16Overflow;
        using spyre::Df16Rounding;
        return spyre::df16_encode(x, nearest_even ? Df16Rounding::kNearestEven : Df16Rounding::kNearestAway,
                                  saturate ? Df16Overflow::kSaturate : Df16Overflow::kNanInf);
      },
      py::arg("x"), py::arg("nearest_even"), py::arg("saturate"), py::call_guard<py::gil_scoped_release>());
  m.def("_df16_decode", &spyre::df16_decode, py::arg("bits"), py::call_guard<py::gil_scoped_release>());
  // The Spyre direct kernels' 16-bit conversions (executors/spyre/convert16.h)
  // on the build cpu::has picks now: df16 of a float32 tensor held in a 16-bit
  // dtype, a float32 tensor to float16 to nearest even (no df16 step), and a
  // 16-bit tensor's exact float32 widening (contiguous copies in).
  m.def(
      "_spyre_store16",
      [](const at::Tensor& x, c10::ScalarType dtype) {
        TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.device().is_cpu() && spyre::is_dtype16(dtype),
                         "expects a float32 CPU tensor and a 16-bit dtype");
        const at::Tensor in = x.contiguous();
        at::Tensor out = at::empty(in.sizes(), in.options().dtype(dtype));
        spyre::store16(dtype, in.const_data_ptr<float>(), static_cast<uint16_t*>(out.data_ptr()), in.numel());
        return out;
      },
      py::arg("x"), py::arg("dtype"));
  m.def(
      "_spyre_narrow_half",
      [](const at::Tensor& x) {
        TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.device().is_cpu(), "expects a float32 CPU tensor");
        const at::Tensor in = x.contiguous();
        at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kHalf));
        spyre::narrow_half(in.const_data_ptr<float>(), static_cast<uint16_t*>(out.data_ptr()), in.numel());
        return out;
      },
      py::arg("x"));
  m.def(
      "_spyre_widen16",
      [](const at::Tensor& x) {
        TORCH_CHECK_TYPE(spyre::is_dtype16(x.scalar_type()) && x.device().is_cpu(), "expects a 16-bit CPU tensor");
        const at::Tensor in = x.contiguous();
        at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kFloat));
        spyre::widen16(in.scalar_type(), static_cast<const uint16_t*>(in.const_data_ptr()),
                       out.mutable_data_ptr<float>(), in.numel());
        return out;
      },
      py::arg("x"));
  // The exp estimate of softmax's normalizing pass (None without AVX2 and FMA),
  // on the build the pass runs: 16 AVX-512 lanes where the CPU has them and
  // they are not switched off (_set_cpu_features_off), else 8 AVX2 lanes.
  m.def(
      "_softmax_exp_estimate",
      [](const at::Tensor& x) -> std::optional<at::Tensor> {
        TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.device().is_cpu(), "expects a float32 CPU tensor");
        const at::Tensor in = x.contiguous();
        at::Tensor y = at::empty_like(in);
        if (!spyre::df16_exp_estimate_array(in.const_data_ptr<float>(), y.mutable_data_ptr<float>(), in.numel()))
          return std::nullopt;
        return y;
      },
      py::arg("x"));
  // {name: bool}: the CPU features the executors' vector kernels choose by
  // (executors/cpu_features.h), as they see them now.
  m.def("_cpu_features", [] {
    py::dict out;
    for (int i = 0; i < cpu::kFeatureCount; ++i) {
      const auto f = static_cast<cpu::Feature>(i);
      out[cpu::name(f)] = cpu::has(f);
    }
    return out;
  });
  // Switches the named features off (the others on) so a test runs the
  // narrower builds; returns the names switched off before. ValueError for an
  // unknown name (nothing changed).
  m.def(
      "_set_cpu_features_off",
      [](const std::vector<std::string>& names) {
        uint32_t mask = 0;
        for (const auto& n : names) {
          int i = 0;
          while (i < cpu::kFeatureCount && n != cpu::name(static_cast<cpu::Feature>(i))) ++i;
          if (i == cpu::kFeatureCount) throw py::value_error("unknown CPU feature '" + n + "'");
          mask |= cpu::bit(static_cast<cpu::Feature>(i));
        }
        const uint32_t before = cpu::set_disabled(mask);
        std::vector<std::string> out;
        for (int i = 0; i < cpu::kFeatureCount; ++i)
          if (before & cpu::bit(static_cast<cpu::Feature>(i)))
            out.emplace_back(cpu::name(static_cast<cpu::Feature>(i)));
        return out;
      },
      py::arg("names"));
  m.attr("FLUSH_SYNCHRONIZE") = static_cast<int>(FlushReason::kSynchronize);
  m.attr("FLUSH_HOST_READ") = static_cast<int>(FlushReason::kHostRead);
  m.attr("FLUSH_TARGET_SWITCH") = static_cast<int>(FlushReason::kTargetSwitch);
  bind_custom_ops(m);  // custom ops on tpu (python/custom_ops.cpp)
}
