// comms-bench: nccl-tests-style measurements of the Comm API, run under
// commsrun, with nccl-tests' flags and meanings (-o reduce op, -r root, -d,
// -a, -c 1 by default; the collective is -C/--coll or the program's name,
// e.g. a link all_reduce_perf -> comms-bench). For each size it times every
// iteration on every rank, combines each iteration over ranks (-a; default
// the slowest rank), and prints the mean, p50 and p99 with algbw and busbw
// (nccl-tests' busbw factors).
// The baselines (baseline.h): --raw-plugin (alias --raw-gloo) times the
// comm's own backend plugin called directly through the plugin ABI
// (plugin_baseline.h), so libcomms' overhead shows; --gloo-native times
// Gloo's own algorithm classes (gloo_native.h); with --device cuda,
// --raw-nccl times NCCL's API called directly (raw_nccl.h). --overhead
// alternates comms and the baseline every iteration and reports both.
// --floor adds each row's memory-bound floor on this host (floor.h) and the
// ratio p50 / floor. --device cuda runs on the rank's GPU (bench_cuda.h:
// buffers, stream, timing).
//
// -C put compares one-sided windows with send/recv (put_bench.h).
//
// Files: options (flags and their checks), runner (one row's measurement),
// report (table and JSON), the baselines, floor, put_bench; this file wires
// them up.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "gloo_native.h"
#include "options.h"
#include "plugin_baseline.h"
#include "put_bench.h"
#include "report.h"
#include "runner.h"
#if COMMS_BENCH_CUDA
#include "raw_nccl.h"
#endif
#include "comms/comms.h"
#include "util/strutil.h"

namespace {

using namespace comms;
using namespace comms::bench;
using plugin::OpType;

// The flags read and checked before any rendezvous: every rank has the same.
struct Setup {
  const OpInfo* op = nullptr;
  DataType dtype{};
  ReduceOp redop;
  size_t es = 0, lo = 0, hi = 0, step = 0;
  bool on_cuda = false;
  CommOptions options;
};

Setup check_flags(const Flags& f) {
  Setup s;
  s.op = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpInfo& o) { return f.op_name == o.name; });
  s.dtype = parse_data_type(f.dtype_name);
  // comms-bench's -o was the collective once; nccl-tests' -o is the reduce op.
  if (std::any_of(std::begin(kOps), std::end(kOps), [&](const OpInfo& o) { return f.redop_name == o.name; })) {
    bad_flag("-o/--op", str::cat("='", f.redop_name, "' is a collective, but -o is the reduce op (sum, max, ...) "
                                 "as in nccl-tests: give the collective with -C/--coll ", f.redop_name));
  }
  s.redop = parse_reduce_op(f.redop_name);
  s.es = element_size(s.dtype);
  s.lo = parse_size(f.min_size, "-b/--minbytes");
  s.hi = parse_size(f.max_size, "-e/--maxbytes");
  if (s.op->type != OpType::kBarrier) {
    check_range(f.min_size, f.max_size, s.lo, s.hi, s.es, str::cat("one ", f.dtype_name, " element"));
  }
  s.step = parse_size(f.step_bytes, "-i/--stepbytes");
  if (f.ngpus != 1) {
    bad_flag("-g/--ngpus", str::cat("=", f.ngpus, ": comms-bench drives one device per process; start one rank per "
                                    "device instead (commsrun -n <ranks per node>)"));
  }
  s.on_cuda = f.device_name == "cuda";
  if (f.raw_nccl && !s.on_cuda) bad_flag("--raw-nccl", " times NCCL on CUDA buffers; give --device cuda as well");
  if (f.graph && !s.on_cuda) bad_flag("--graph", " replays CUDA graphs; give --device cuda as well");
  if (f.floor && s.on_cuda) bad_flag("--floor", " is the floor of host memory; it has none for --device cuda");
  if (f.local_register && s.on_cuda) {
    bad_flag("-R/--local_register", "=1 allocates cpu buffers through the comm; --device cuda keeps its own buffers");
  }
  if (f.huge_pages && s.on_cuda) bad_flag("--huge-pages", " places cpu buffers; --device cuda keeps its own buffers");
  if (s.on_cuda && (f.raw_gloo || f.gloo_native)) {
    bad_flag(f.raw_gloo ? "--raw-gloo" : "--gloo-native",
             f.raw_gloo ? " times the cpu backend's plugin on CPU buffers; with --device cuda, --raw-plugin (the "
                          "nccl plugin), --raw-nccl or --overhead is the baseline"
                        : " times Gloo on CPU buffers; with --device cuda, --raw-plugin (the nccl plugin), "
                          "--raw-nccl or --overhead is the baseline");
  }
  for (const std::string& h : f.hint_texts) {
    const size_t eq = h.find('=');
    if (eq == std::string::npos || eq == 0) bad_flag("--hint", str::cat("='", h, "' is not KEY=VALUE"));
    s.options.hints[h.substr(0, eq)] = h.substr(eq + 1);
  }
  if (s.on_cuda) bench::check_cuda(s.op->type, s.dtype, s.redop.kind, f.raw_nccl, bootstrap_from_environment().local_rank);
  return s;
}

// --device cuda: the rank's device and stream, the priority the nccl plugin
// gave its own stream for this comm.
std::unique_ptr<CudaBench> open_cuda(const Flags& f, const Setup& s, Comm& comm, const nlohmann::json& described) {
  // The bench's own bookkeeping (timings, checks) runs on CPU buffers.
  if (comm.backends().backend_for(DeviceType::kCuda) != "nccl" || !comm.backends().has(DeviceType::kCpu)) {
    bad_flag("--device cuda", str::cat(" measures the nccl backend and keeps its books on a cpu backend; this comm's "
                                       "backends are '", comm.backend_string(),
                                       "': give e.g. --backend cpu:gloo,cuda:nccl"));
  }
  const nlohmann::json::json_pointer priority("/backends/cuda/config/stream_priority/class");
  auto cuda = CudaBench::open(comm.local_rank(), described.value(priority, "") == "high");
  cuda->check_supported(s.op->type, s.dtype, s.redop.kind, f.raw_nccl);
  return cuda;
}

// The baseline the flags name, connected (collective over the comm); null
// without one.
std::unique_ptr<Baseline> open_baseline(const Flags& f, Comm& comm, CudaBench* cuda, const nlohmann::json& described) {
  if (!f.has_raw()) return nullptr;
  if (f.gloo_native) {
    // Reads wait as the gloo backend's do when it spins (its resolved busy_poll).
    const nlohmann::json::json_pointer busy_poll("/backends/cpu/config/busy_poll");
    return open_gloo_native(*make_prefix_store("comms-bench/gloo-native", comm.store()), comm.rank(), comm.size(),
                            comm.local_size(), comm.op_timeout(), described.value(busy_poll, "") == "1");
  }
  if (f.raw_nccl) {  // check_flags let it through only with CUDA
#if COMMS_BENCH_CUDA
    const nlohmann::json::json_pointer config("/backends/cuda/config/nccl_config");
    if (!described.contains(config) || !described.at(config).is_object()) {
      throw Error(ErrorCode::kInternal, "comms-bench: --raw-nccl builds its communicator's config from the nccl "
                                        "plugin's describe() \"nccl_config\", which this comm's does not have");
    }
    return open_raw_nccl(*make_prefix_store("comms-bench/raw-nccl", comm.store()), comm.rank(), comm.size(),
                         cuda->device(), described.at(config), comm.init_timeout(), comm.op_timeout());
#endif
  }
  return open_plugin_baseline(comm, cuda ? Device::cuda(cuda->device()) : Device::cpu(), described);
}

// Two buffers of the largest size on every rank of this host (and on the
// device). Ranks agree on the verdict (their free memory differs a little),
// so none is left waiting for the others.
void check_memory(const Flags& f, const Setup& s, Comm& comm, CudaBench* cuda) {
  const size_t avail = available_memory();
  // --floor: rank 0 also holds every rank's two buffers for the floor's threads.
  const double need = 2.0 * double(s.hi + 64) * (comm.local_size() + (f.floor ? comm.size() : 0));
  // On cuda the host buffers are mirrors; the device holds one rank's two.
  const size_t device_free = cuda ? cuda->free_memory() : 0;
  const bool device_fits = !cuda || 2.0 * double(s.hi + 64) <= double(device_free);
  int32_t fits[2] = {s.op->type == OpType::kBarrier || avail == 0 || need <= double(avail) ? 1 : 0,
                     s.op->type == OpType::kBarrier || device_fits ? 1 : 0};
  comm.all_reduce(BufferView::of(fits, 2), ReduceOp::min());
  if (!fits[0]) {
    bad_flag("-e/--maxbytes", str::cat("='", f.max_size, "' needs two buffers of ", s.hi, " bytes on each of the ",
                                       comm.local_size(), " ranks of a host (", std::llround(need / (1 << 20)),
                                       " MiB), more than its available memory (",
                                       avail ? str::cat(avail >> 20, " MiB") : std::string("unknown here"),
                                       "); give a smaller size or fewer ranks per host"));
  }
  if (!fits[1]) {
    bad_flag("-e/--maxbytes", str::cat("='", f.max_size, "' needs two device buffers of ", s.hi,
                                       " bytes per rank, more than some rank's free device memory (this one has ",
                                       device_free >> 20, " MiB); give a smaller size"));
  }
}

// Every row from -b to -e, each placement; rank 0 prints them as they come.
std::vector<Row> run_rows(const Flags& f, const Setup& s, Comm& comm, Bench& bench, size_t unit) {
  std::vector<bool> placements;
  if (!f.outofplace || f.inplace) placements.push_back(true);
  if (!f.inplace || f.outofplace) placements.push_back(false);
  if (s.op->type == OpType::kBarrier || s.op->type == OpType::kSend || f.has_raw()) placements = {false};
  std::vector<Row> rows;
  for (size_t bytes = s.lo; bytes <= s.hi;) {
    for (bool in_place : placements) {
      Row r = bench.run(bytes, in_place);
      if (comm.rank() == 0 && f.json_path != "-") print_row(f, r);
      rows.push_back(std::move(r));
    }
    if (s.op->type == OpType::kBarrier) break;
    // Steps between the flags round down to whole units (at least one more).
    const double grown = s.step ? double(bytes) + double(s.step) : std::ceil(double(bytes) * f.factor);
    if (grown > double(s.hi)) break;  // also keeps the cast below in range
    const size_t next = static_cast<size_t>(grown);
    bytes = std::max(next - next % unit, bytes + unit);
  }
  return rows;
}

// -C put (put_bench.h): windows beside send/recv, on CPU buffers.
int run_put(const Flags& f) {
  CommOptions options;
  for (const std::string& h : f.hint_texts) {
    const size_t eq = h.find('=');
    if (eq == std::string::npos || eq == 0) bad_flag("--hint", str::cat("='", h, "' is not KEY=VALUE"));
    options.hints[h.substr(0, eq)] = h.substr(eq + 1);
  }
  auto comm = new_comm(f.backend, Device::cpu(), "bench", options);
  const int status = run_put_bench(f, comm);
  comm->finalize();
  return status;
}

int run(const Flags& f) {
  if (f.op_name == "put") return run_put(f);
  const Setup s = check_flags(f);
  // On cuda the comm binds the local rank's device eagerly (the NCCL
  // communicator exists before the first timed op).
  auto comm = new_comm(f.backend, s.on_cuda ? Device::cuda() : Device::cpu(), "bench", s.options);
  const auto described = nlohmann::json::parse(comm->describe());
  std::unique_ptr<CudaBench> cuda;
  if (s.on_cuda) cuda = open_cuda(f, s, *comm, described);
  // Sizes that are totals over ranks split into equal per-rank parts.
  const size_t unit = s.op->size_is_total ? s.es * static_cast<size_t>(comm->size()) : s.es;
  if (s.op->type != OpType::kBarrier) {
    check_range(f.min_size, f.max_size, s.lo, s.hi, unit,
                s.op->size_is_total ? str::cat("one ", f.dtype_name, " element per rank, ", comm->size(), " ranks: ",
                                               s.op->name, " splits the size among them")
                                    : str::cat("one ", f.dtype_name, " element"));
  }
  if (f.root >= comm->size()) {
    bad_flag("-r/--root", str::cat("=", f.root, " is not a rank of this ", comm->size(), "-rank job (0 to ",
                                   comm->size() - 1, ")"));
  }
  if (f.floor && comm->local_size() != comm->size()) {
    bad_flag("--floor", str::cat(" times threads of one process in place of the ranks, so every rank must be on one "
                                 "host; this job has ", comm->local_size(), " of its ", comm->size(),
                                 " ranks on this one"));
  }
  check_memory(f, s, *comm, cuda.get());
  std::unique_ptr<Baseline> baseline = open_baseline(f, *comm, cuda.get(), described);
  // Rank 0's iteration counts rule, so every rank runs the same loop.
  int32_t plan[2] = {f.iters, f.warmup};
  comm->broadcast(BufferView::of(plan, 2), 0);
  Bench bench(comm, *s.op, s.dtype, s.redop, f.root, static_cast<Average>(f.average), plan[0], plan[1], f.check == 1,
              baseline.get(), cuda.get(),
              BackendPaths::from_describe(described, s.on_cuda ? DeviceType::kCuda : DeviceType::kCpu), f.overhead,
              f.graph, f.floor,
              f.local_register == 1 ? HostMemory::kBackend
              : f.huge_pages        ? HostMemory::kHugePages
                                    : HostMemory::kPlain);
  const std::string where = cuda                 ? str::cat("cuda:", cuda->device())
                            : f.local_register   ? "cpu (the comm's allocator, registered: -R 1)"
                            : f.huge_pages       ? "cpu (huge pages)"
                                                 : "cpu";
  const RunInfo info{s.op, comm->size(), comm->backend_string(), where,
                     cuda != nullptr, baseline ? baseline->name() : "", plan[0], plan[1]};
  // --json -: the JSON alone on stdout.
  if (comm->rank() == 0 && f.json_path != "-") print_header(f, info);
  const std::vector<Row> rows = run_rows(f, s, *comm, bench, unit);
  int64_t total_wrong = 0;
  for (const auto& r : rows) total_wrong += r.wrong;
  if (comm->rank() == 0) {
    if (f.json_path != "-") std::printf("# %s wrong results\n", total_wrong ? "SOME" : "no");
    if (!f.json_path.empty()) write_json(f, info, rows);
  }
  // The baseline's connections go before the comm's, whose store they use.
  if (baseline) baseline->finalize();
  if (cuda) cuda->close();
  comm->finalize();
  return total_wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comms-bench: nccl-tests-style benchmarks of comms (run under commsrun)"};
  Flags flags;
  // all_reduce_perf and its siblings (links to comms-bench) run their op.
  const std::string named_op = op_from_program_name(argv[0]);
  if (!named_op.empty()) flags.op_name = named_op;
  add_flags(app, flags);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comms-bench: %s\n", e.what());
    return 1;
  }
}
