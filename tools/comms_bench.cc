// comms-bench: nccl-tests-style measurements of the Comm API, run under
// commsrun. For each size it times every iteration on every rank, takes the
// max over ranks of each iteration (as nccl-tests reports), and prints the
// mean, p50 and p99 with algbw and busbw (nccl-tests' busbw factors).
// --raw-gloo times the Gloo backend's own algorithm for the same op and size
// called directly (backends/gloo/raw_gloo.h), so libcomms' overhead shows;
// --gloo-native times Gloo's own algorithm classes instead; --overhead
// alternates comms and the raw call every iteration and reports both.
// --device cuda runs on the rank's GPU (bench_cuda.h: buffers, stream,
// timing), and --raw-nccl is there what --raw-gloo is on CPU buffers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comm_impl.h"
#include "comms/comms.h"
#include "comms/numeric.h"
#include "op_rules.h"
#include "bench_cuda.h"
#include "raw_gloo.h"
#include "strutil.h"

namespace {

using namespace comms;
using plugin::OpType;
using Clock = std::chrono::steady_clock;

struct OpInfo {
  const char* name;
  OpType type;
  // busbw = algbw * factor(n), as nccl-tests defines it.
  double (*bus_factor)(int n);
  // How many elements the op's "count" is for a size in bytes (the size is
  // the largest buffer: nccl-tests' convention).
  bool size_is_total;
};

double one(int) { return 1; }
double all_reduce_factor(int n) { return 2.0 * (n - 1) / n; }
double gather_factor(int n) { return double(n - 1) / n; }

const OpInfo kOps[] = {
    {"all_reduce", OpType::kAllReduce, all_reduce_factor, false},
    {"all_gather", OpType::kAllGather, gather_factor, true},
    {"reduce_scatter", OpType::kReduceScatter, gather_factor, true},
    {"broadcast", OpType::kBroadcast, one, false},
    {"reduce", OpType::kReduce, one, false},
    {"all_to_all", OpType::kAllToAll, gather_factor, true},
    {"gather", OpType::kGather, gather_factor, true},
    {"scatter", OpType::kScatter, gather_factor, true},
    {"barrier", OpType::kBarrier, one, false},
    {"send_recv", OpType::kSend, one, false},
};

// The largest size a row may have. Each rank holds two buffers of it.
constexpr size_t kMaxBytes = size_t{1} << 40;

[[noreturn]] void bad_flag(std::string_view flag, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, str::cat(flag, why));
}

// "4096", "4K", "1.5M", "2G" (binary units): a whole number of bytes, at most kMaxBytes.
size_t parse_size(const std::string& text, std::string_view flag) {
  std::string_view t = str::strip(text);
  double scale = 1;
  if (!t.empty()) {
    switch (t.back()) {
      case 'K': case 'k': scale = 1024; t.remove_suffix(1); break;
      case 'M': case 'm': scale = 1024.0 * 1024; t.remove_suffix(1); break;
      case 'G': case 'g': scale = 1024.0 * 1024 * 1024; t.remove_suffix(1); break;
      default: break;
    }
  }
  double v = 0;
  // !(v >= 0) also rejects NaN.
  if (!str::parse_double(t, &v) || !(v >= 0) || v * scale != std::floor(v * scale)) {
    bad_flag(flag, str::cat("='", text, "' is not a size in bytes; use e.g. 4096, 4K, 1M or 2G (binary units)"));
  }
  if (v * scale > double(kMaxBytes)) {
    bad_flag(flag, str::cat("='", text, "' is more than comms-bench runs, ", kMaxBytes >> 30, "G"));
  }
  return static_cast<size_t>(v * scale);
}

// MemAvailable from /proc/meminfo, or 0 when unknown.
size_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// Rejects a range this run cannot do. `unit`: the bytes a size must be a
// multiple of (one element, or one per rank where the size is the total).
void check_range(const std::string& min_text, const std::string& max_text, size_t lo, size_t hi, size_t unit,
                 const std::string& unit_why) {
  if (lo > hi) {
    bad_flag("-b/--minbytes", str::cat("='", min_text, "' (", lo, " bytes) is above -e/--maxbytes='", max_text, "' (",
                                       hi, " bytes); give a minimum at most the maximum"));
  }
  for (auto [flag, text, bytes] : {std::tuple{"-b/--minbytes", &min_text, lo}, {"-e/--maxbytes", &max_text, hi}}) {
    if (bytes % unit != 0) {
      bad_flag(flag, str::cat("='", *text, "' (", bytes, " bytes) is not a multiple of ", unit, " bytes (", unit_why,
                              ")"));
    }
  }
}

struct Row {
  std::string op, dtype, redop, placement;
  size_t bytes = 0, count = 0;
  double mean_us = 0, p50_us = 0, p99_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
  bool raw = false;
  std::string algorithm;
  // --overhead: the same op through raw Gloo (raw NCCL on cuda), timed in
  // alternation with it.
  double raw_mean_us = 0, raw_p50_us = 0;
};

class Bench {
 public:
  // `cuda`: buffers on its device and ops on its stream, its raw NCCL as
  // the baseline; else CPU buffers and `raw` (Gloo). `has_raw`: a baseline
  // was connected (--raw-*, --overhead).
  Bench(std::shared_ptr<Comm> comm, const OpInfo& op, DataType dtype, ReduceOp redop, int iters, int warmup,
        bool check, gloo_backend::RawGloo* raw, bench::CudaBench* cuda, bool has_raw, bool overhead)
      : comm_(std::move(comm)), op_(op), dtype_(dtype), redop_(redop), iters_(iters), warmup_(warmup),
        check_(check), raw_(raw), cuda_(cuda), has_raw_(has_raw), overhead_(overhead) {}

  Row run(size_t bytes, bool in_place) {
    const int n = comm_->size();
    const int rank = comm_->rank();
    const size_t es = element_size(dtype_);
    // count: the op's per-rank element count (OpDesc convention).
    size_t count = bytes / es;
    if (op_.size_is_total) count /= static_cast<size_t>(n);
    const size_t big = op_.size_is_total ? count * n : count;
    in_.assign(big * es + 64, 0);
    out_.assign(big * es + 64, 0);
    // The host buffers are the device buffers' mirrors on cuda: filled and
    // checked here, copied on the bench's stream.
    if (cuda_) cuda_->reserve(in_.size());
    uint8_t* const in_base = cuda_ ? cuda_->input() : in_.data();
    uint8_t* const out_base = cuda_ ? cuda_->output() : out_.data();
    const Device device = cuda_ ? Device::cuda(cuda_->device()) : Device::cpu();
    OpOptions opts;
    opts.stream = cuda_ ? cuda_->stream() : nullptr;
    const bool p2p = op_.type == OpType::kSend;
    const int peer = rank ^ 1;
    if (p2p && peer >= n) throw std::invalid_argument("send_recv needs an even number of ranks");

    auto fill = [&] {
      for (size_t i = 0; i < big; ++i) numeric::store_from_double(in_.data(), dtype_, i, double((rank + 1) + i % 3));
      if (in_place) std::copy(in_.begin(), in_.end(), out_.begin());
      if (cuda_) cuda_->upload(in_, out_);
    };
    fill();
    auto issue = [&](bool use_raw) {
      void* output = in_place ? in_base : out_base;
      if (use_raw && cuda_) {
        cuda_->run_raw(op_.type, in_base, output, count, dtype_, redop_, 0, peer);
        return;
      }
      if (use_raw) {
        raw_->run(op_.type, in_.data(), output, count, dtype_, redop_.kind, 0, peer);
        return;
      }
      BufferView in{in_base, count, dtype_, device};
      BufferView out{output, count, dtype_, device};
      switch (op_.type) {
        case OpType::kAllReduce: comm_->all_reduce(in, out, redop_, opts); break;
        case OpType::kReduce: comm_->reduce(in, out, 0, redop_, opts); break;
        case OpType::kBroadcast: comm_->broadcast(in, 0, opts); break;
        case OpType::kAllGather:
          out.count = count * n;
          if (in_place) in.data = in_base + rank * count * es;
          comm_->all_gather(in, out, opts);
          break;
        case OpType::kReduceScatter:
          in.count = count * n;
          if (in_place) out.data = in_base + rank * count * es;
          comm_->reduce_scatter(in, out, redop_, opts);
          break;
        case OpType::kAllToAll:
          in.count = out.count = count * n;
          comm_->all_to_all(in, out, opts);
          break;
        case OpType::kGather:
          out.count = count * n;
          if (in_place) in.data = out_base + 0;  // root 0's slice
          comm_->gather(in, out, 0, opts);
          break;
        case OpType::kScatter:
          in.count = count * n;
          if (in_place && rank == 0) out.data = in_base;
          comm_->scatter(in, out, 0, opts);
          break;
        case OpType::kBarrier: comm_->barrier(opts); break;
        case OpType::kSend: {
          const P2POp ops[] = {P2POp::send(in, peer), P2POp::recv(out, peer)};
          comm_->batch_p2p(ops, opts);
          break;
        }
        default: break;
      }
    };

    // The timed op: raw Gloo for --raw-gloo, else comms; --overhead times
    // both, alternating per iteration so that noise hits them alike.
    const bool primary_raw = has_raw_ && !overhead_;
    // On cuda an op is done when the bench's stream is (bench_cuda.h says
    // why this and not events).
    auto timed = [&](bool use_raw) {
      const auto start = Clock::now();
      issue(use_raw);
      if (cuda_) cuda_->synchronize();
      return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    };
    int64_t wrong = 0;
    if (check_) {
      // --overhead checks both sides.
      for (bool side : overhead_ ? std::vector<bool>{false, true} : std::vector<bool>{primary_raw}) {
        timed(side);
        if (cuda_) cuda_->download(in_, out_);
        wrong += count_wrong(count, in_place, rank, n, peer);
        fill();
      }
      comm_->all_reduce(BufferView::of(&wrong, 1), ReduceOp::sum());
    }
    for (int i = 0; i < warmup_; ++i) {
      timed(primary_raw);
      if (overhead_) timed(true);
    }
    std::vector<double> times(static_cast<size_t>(iters_)), raw_times(overhead_ ? times.size() : 0);
    for (int i = 0; i < iters_; ++i) {
      const auto k = static_cast<size_t>(i);
      // Odd iterations run raw first, so neither side always follows the other.
      if (overhead_ && i % 2) raw_times[k] = timed(true);
      times[k] = timed(primary_raw);
      if (overhead_ && i % 2 == 0) raw_times[k] = timed(true);
    }
    // Each iteration takes as long as its slowest rank.
    comm_->all_reduce(BufferView::of(times), ReduceOp::max());
    if (overhead_) comm_->all_reduce(BufferView::of(raw_times), ReduceOp::max());
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    Row row;
    row.op = op_.name;
    row.dtype = std::string(to_string(dtype_));
    row.redop = to_string(redop_);
    row.placement = in_place ? "in-place" : "out-of-place";
    row.bytes = op_.type == OpType::kBarrier ? 0 : (op_.size_is_total ? count * n * es : count * es);
    row.count = count;
    row.mean_us = std::accumulate(times.begin(), times.end(), 0.0) / std::max<size_t>(1, times.size());
    row.p50_us = sorted[sorted.size() / 2];
    row.p99_us = sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
    row.algbw = row.mean_us > 0 ? double(row.bytes) / (row.mean_us * 1e3) : 0;  // GB/s
    row.busbw = row.algbw * op_.bus_factor(n);
    row.wrong = wrong;
    row.raw = primary_raw;
    if (overhead_) {
      std::vector<double> raw_sorted = raw_times;
      std::sort(raw_sorted.begin(), raw_sorted.end());
      row.raw_p50_us = raw_sorted[raw_sorted.size() / 2];
      row.raw_mean_us = std::accumulate(raw_times.begin(), raw_times.end(), 0.0) / double(raw_times.size());
    }
    row.algorithm = cuda_         ? cuda_->algorithm(op_.type)
                    : primary_raw ? raw_->algorithm(op_.type, count * es)
                    : comm_->backends().backend_for(DeviceType::kCpu) == "gloo"
                        ? std::string(gloo_backend::algorithm_name(
                              op_.type, gloo_backend::sync_algorithm_for(op_.type, count * es, n)))
                        : std::string();
    return row;
  }

 private:
  // Checks the output against the closed form for the values fill() wrote.
  int64_t count_wrong(size_t count, bool in_place, int rank, int n, int peer) const {
    const uint8_t* out = in_place ? in_.data() : out_.data();
    auto value = [&](int r, size_t i) { return double((r + 1) + i % 3); };
    auto same = [&](const uint8_t* buf, size_t i, double want) {
      std::vector<uint8_t> cell(8);
      numeric::store_from_double(cell.data(), dtype_, 0, want);  // round like the type
      const double w = numeric::load_as_double(cell.data(), dtype_, 0);
      const double got = numeric::load_as_double(buf, dtype_, i);
      return std::fabs(got - w) <= 1e-2 * std::max(1.0, std::fabs(w));
    };
    int64_t wrong = 0;
    auto reduced = [&](size_t i) {
      double acc = redop_.kind == ReduceKind::kProduct ? 1 : 0;
      double mx = -1e300, mn = 1e300;
      for (int r = 0; r < n; ++r) {
        acc = redop_.kind == ReduceKind::kProduct ? acc * value(r, i) : acc + value(r, i);
        mx = std::max(mx, value(r, i));
        mn = std::min(mn, value(r, i));
      }
      switch (redop_.kind) {
        case ReduceKind::kMax: return mx;
        case ReduceKind::kMin: return mn;
        case ReduceKind::kAvg: return acc / n;
        case ReduceKind::kPremulSum: return acc * redop_.scalar;
        default: return acc;
      }
    };
    switch (op_.type) {
      case OpType::kAllReduce:
        for (size_t i = 0; i < count; ++i) wrong += !same(out, i, reduced(i));
        break;
      case OpType::kReduce:
        if (rank == 0)
          for (size_t i = 0; i < count; ++i) wrong += !same(out, i, reduced(i));
        break;
      case OpType::kBroadcast:
        for (size_t i = 0; i < count; ++i) wrong += !same(in_.data(), i, value(0, i));
        break;
      case OpType::kAllGather:
        for (size_t j = 0; j < count * n; ++j) {
          const int r = int(j / count);
          // In place, each rank's input is its own slice of the filled buffer.
          wrong += !same(in_place ? in_.data() : out_.data(), j, in_place ? value(r, j) : value(r, j % count));
        }
        break;
      case OpType::kReduceScatter:
        for (size_t i = 0; i < count; ++i) {
          const uint8_t* buf = in_place ? in_.data() + rank * count * element_size(dtype_) : out_.data();
          wrong += !same(buf, i, reduced(rank * count + i));
        }
        break;
      case OpType::kAllToAll:
        for (size_t j = 0; j < count * n; ++j) wrong += !same(out, j, value(int(j / count), rank * count + j % count));
        break;
      case OpType::kSend:
        for (size_t i = 0; i < count; ++i) wrong += !same(out, i, value(peer, i));
        break;
      default:
        break;  // gather/scatter/barrier: timing only
    }
    return wrong;
  }

  std::shared_ptr<Comm> comm_;
  const OpInfo& op_;
  DataType dtype_;
  ReduceOp redop_;
  int iters_, warmup_;
  bool check_;
  gloo_backend::RawGloo* raw_;
  bench::CudaBench* cuda_;
  bool has_raw_;
  bool overhead_;
  std::vector<uint8_t> in_, out_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comms-bench: nccl-tests-style benchmarks of comms (run under commsrun)"};
  std::string op_name = "all_reduce", min_size = "4K", max_size = "4K", dtype_name = "float32", redop_name = "sum";
  std::string backend, json_path, device_name = "cpu";
  std::vector<std::string> hint_texts;
  double factor = 2;
  int iters = 20, warmup = 5, check = 0;
  bool inplace = false, outofplace = false, raw_gloo = false, gloo_native = false, overhead = false;
  bool raw_nccl = false;
  std::vector<std::string> op_names;
  for (const auto& o : kOps) op_names.emplace_back(o.name);
  app.add_option("-o,--op", op_name, "operation")->check(CLI::IsMember(op_names));
  app.add_option("-b,--minbytes", min_size, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", max_size, "largest size");
  app.add_option("-f,--stepfactor", factor, "size multiplier between rows")->check(CLI::Range(1.01, 1e9));
  app.add_option("-d,--datatype", dtype_name, "data type");
  app.add_option("-r,--redop", redop_name, "reduce op");
  app.add_option("-n,--iters", iters, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", warmup, "warm-up iterations")->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", check, "1: check results and report #wrong")->check(CLI::Range(0, 1));
  app.add_flag("--inplace", inplace, "only in-place");
  app.add_flag("--outofplace", outofplace, "only out-of-place (default: both)");
  app.add_option("--backend", backend, "backend string (default COMMS_BACKEND, else the default map)");
  app.add_option("--json", json_path, "write the results as JSON");
  app.add_option("--device", device_name, "where the buffers live: cpu, or cuda (the local rank's GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--hint", hint_texts, "a comm hint KEY=VALUE, e.g. nccl.max_ctas=4 (repeatable)");
  app.add_flag("--raw-gloo", raw_gloo, "time the Gloo backend's algorithm called directly, without libcomms");
  app.add_flag("--gloo-native", gloo_native,
               "time Gloo's own algorithm classes directly where the backend runs its own algorithms")
      ->excludes("--raw-gloo");
  app.add_flag("--raw-nccl", raw_nccl,
               "with --device cuda: time the same op called straight through NCCL, on a communicator with the "
               "plugin's config for this comm's hints, on the same stream")
      ->excludes("--raw-gloo")
      ->excludes("--gloo-native");
  app.add_flag("--overhead", overhead,
               "time each op through comms and through the raw baseline in alternation; report both (raw Gloo, "
               "same algorithm, on cpu; raw NCCL on cuda)")
      ->excludes("--raw-gloo")
      ->excludes("--gloo-native")
      ->excludes("--raw-nccl");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto* op = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpInfo& o) { return op_name == o.name; });
    const DataType dtype = parse_data_type(dtype_name);
    const ReduceOp redop = parse_reduce_op(redop_name);
    const size_t es = element_size(dtype);
    // Checked before any rendezvous: every rank has the same flags.
    const size_t lo = parse_size(min_size, "-b/--minbytes"), hi = parse_size(max_size, "-e/--maxbytes");
    if (op->type != OpType::kBarrier) check_range(min_size, max_size, lo, hi, es, str::cat("one ", dtype_name, " element"));
    const bool on_cuda = device_name == "cuda";
    if (raw_nccl && !on_cuda) bad_flag("--raw-nccl", " times NCCL on CUDA buffers; give --device cuda as well");
    if (on_cuda && (raw_gloo || gloo_native)) {
      bad_flag(raw_gloo ? "--raw-gloo" : "--gloo-native",
               " times Gloo on CPU buffers; with --device cuda, --raw-nccl (or --overhead) is the baseline");
    }
    CommOptions options;
    for (const std::string& h : hint_texts) {
      const size_t eq = h.find('=');
      if (eq == std::string::npos || eq == 0) bad_flag("--hint", str::cat("='", h, "' is not KEY=VALUE"));
      options.hints[h.substr(0, eq)] = h.substr(eq + 1);
    }
    const bool has_raw = raw_gloo || gloo_native || raw_nccl || overhead;
    if (on_cuda) bench::check_cuda(op->type, dtype, redop.kind, has_raw, bootstrap_from_environment().local_rank);
    // On cuda the comm binds the local rank's device eagerly (the NCCL
    // communicator exists before the first timed op).
    auto comm = new_comm(backend, on_cuda ? Device::cuda() : Device::cpu(), "bench", options);
    const auto& cfg = comm->impl().config();
    const auto described = nlohmann::json::parse(comm->describe());
    std::unique_ptr<bench::CudaBench> cuda;
    if (on_cuda) {
      // The bench's own bookkeeping (timings, checks) runs on CPU buffers.
      if (comm->backends().backend_for(DeviceType::kCuda) != "nccl" || !comm->backends().has(DeviceType::kCpu)) {
        bad_flag("--device cuda", str::cat(" measures the nccl backend and keeps its books on a cpu backend; this comm's "
                                           "backends are '", comm->backend_string(),
                                           "': give e.g. --backend cpu:gloo,cuda:nccl"));
      }
      Hints nccl_hints;  // as routed to the backend, "nccl." removed
      for (const auto& h : described["backends"]["cuda"]["hints"].items()) nccl_hints[h.key()] = h.value();
      cuda = bench::CudaBench::open(cfg.local_rank, nccl_hints);
      cuda->check_supported(op->type, dtype, redop.kind, has_raw);
      if (has_raw) {
        cuda->connect_raw(*make_prefix_store("raw-nccl", cfg.store), comm->rank(), comm->size(), nccl_hints,
                          comm->name(), comm->init_timeout(), comm->op_timeout());
      }
    }
    // Sizes that are totals over ranks split into equal per-rank parts.
    const size_t unit = op->size_is_total ? es * static_cast<size_t>(comm->size()) : es;
    if (op->type != OpType::kBarrier) {
      check_range(min_size, max_size, lo, hi, unit,
                  op->size_is_total ? str::cat("one ", dtype_name, " element per rank, ", comm->size(), " ranks: ",
                                               op->name, " splits the size among them")
                                    : str::cat("one ", dtype_name, " element"));
    }
    // Two buffers of the largest size on every rank of this host. Ranks
    // agree on the verdict (their free memory differs a little), so none
    // is left waiting for the others.
    const size_t avail = available_memory();
    const double need = 2.0 * double(hi + 64) * cfg.local_size;
    // On cuda the host buffers are mirrors; the device holds one rank's two.
    const size_t device_free = cuda ? cuda->free_memory() : 0;
    const bool device_fits = !cuda || 2.0 * double(hi + 64) <= double(device_free);
    int32_t fits[2] = {op->type == OpType::kBarrier || avail == 0 || need <= double(avail) ? 1 : 0,
                       op->type == OpType::kBarrier || device_fits ? 1 : 0};
    comm->all_reduce(BufferView::of(fits, 2), ReduceOp::min());
    if (!fits[0]) {
      bad_flag("-e/--maxbytes", str::cat("='", max_size, "' needs two buffers of ", hi, " bytes on each of the ",
                                         cfg.local_size, " ranks of a host (", std::llround(need / (1 << 20)),
                                         " MiB), more than its available memory (",
                                         avail ? str::cat(avail >> 20, " MiB") : std::string("unknown here"),
                                         "); give a smaller size or fewer ranks per host"));
    }
    if (!fits[1]) {
      bad_flag("-e/--maxbytes", str::cat("='", max_size, "' needs two device buffers of ", hi,
                                         " bytes per rank, more than some rank's free device memory (this one has ",
                                         device_free >> 20, " MiB); give a smaller size"));
    }
    std::unique_ptr<gloo_backend::RawGloo> raw;
    if (!on_cuda && has_raw) {
      // Reads wait as the backend's do: its resolved busy_poll.
      const std::string busy_poll = described["backends"]["cpu"]["config"].value("busy_poll", "auto");
      raw = std::make_unique<gloo_backend::RawGloo>(
          *make_prefix_store("raw-gloo", cfg.store), comm->rank(), comm->size(), cfg.local_size, comm->op_timeout(),
          busy_poll,
          gloo_native ? gloo_backend::RawGloo::Baseline::kGlooNative : gloo_backend::RawGloo::Baseline::kSameAlgorithm);
    }
    // Rank 0's iteration counts rule, so every rank runs the same loop.
    int32_t plan[2] = {iters, warmup};
    comm->broadcast(BufferView::of(plan, 2), 0);
    Bench bench(comm, *op, dtype, redop, plan[0], plan[1], check == 1, raw.get(), cuda.get(), has_raw, overhead);
    std::vector<bool> placements;
    if (!outofplace || inplace) placements.push_back(true);
    if (!inplace || outofplace) placements.push_back(false);
    if (op->type == OpType::kBarrier || op->type == OpType::kSend || has_raw) placements = {false};

    std::vector<Row> rows;
    if (comm->rank() == 0) {
      const std::string where = cuda ? str::cat("cuda:", cuda->device()) : "cpu";
      std::printf("# comms-bench %s, %d ranks, backend %s, %s buffers%s, %d iterations (%d warm-up)\n", op->name,
                  comm->size(), comm->backend_string().c_str(), where.c_str(),
                  gloo_native            ? " (Gloo's own algorithms, without libcomms)"
                  : overhead && cuda     ? " (comms and raw NCCL, same config and stream, alternating)"
                  : overhead             ? " (comms and raw Gloo, same algorithm, alternating)"
                  : raw_nccl             ? " (raw NCCL: the same calls without libcomms)"
                  : raw                  ? " (raw Gloo: the backend's algorithm without libcomms)"
                                         : "",
                  plan[0], plan[1]);
      if (overhead) {
        std::printf("#%12s %12s %9s %8s %13s %10s %10s %12s %12s %12s %7s  %s\n", "size(B)", "count", "type", "redop",
                    "placement", "time(us)", "p50(us)", "raw p50(us)", "overhead(us)", "overhead(%)", "#wrong",
                    "algorithm");
      } else {
        std::printf("#%12s %12s %9s %8s %13s %10s %10s %10s %10s %10s %7s  %s\n", "size(B)", "count", "type", "redop",
                    "placement", "time(us)", "p50(us)", "p99(us)", "algbw", "busbw", "#wrong", "algorithm");
      }
    }
    for (size_t bytes = lo; bytes <= hi;) {
      for (bool in_place : placements) {
        Row r = bench.run(bytes, in_place);
        if (comm->rank() == 0 && overhead) {
          std::printf(" %12zu %12zu %9s %8s %13s %10.2f %10.2f %12.2f %12.2f %12.2f %7lld  %s\n", r.bytes, r.count,
                      r.dtype.c_str(), r.redop.c_str(), r.placement.c_str(), r.mean_us, r.p50_us, r.raw_p50_us,
                      r.p50_us - r.raw_p50_us, 100.0 * (r.p50_us - r.raw_p50_us) / r.raw_p50_us,
                      static_cast<long long>(r.wrong), r.algorithm.c_str());
          std::fflush(stdout);
        } else if (comm->rank() == 0) {
          std::printf(" %12zu %12zu %9s %8s %13s %10.2f %10.2f %10.2f %10.3f %10.3f %7lld  %s\n", r.bytes, r.count,
                      r.dtype.c_str(), r.redop.c_str(), r.placement.c_str(), r.mean_us, r.p50_us, r.p99_us, r.algbw,
                      r.busbw, static_cast<long long>(r.wrong), r.algorithm.c_str());
          std::fflush(stdout);
        }
        rows.push_back(std::move(r));
      }
      if (op->type == OpType::kBarrier) break;
      // Steps between the flags round down to whole units (at least one more).
      const double grown = std::ceil(double(bytes) * factor);
      if (grown > double(hi)) break;  // also keeps the cast below in range
      const size_t next = static_cast<size_t>(grown);
      bytes = std::max(next - next % unit, bytes + unit);
    }
    int64_t total_wrong = 0;
    for (const auto& r : rows) total_wrong += r.wrong;
    if (comm->rank() == 0) {
      std::printf("# %s wrong results\n", total_wrong ? "SOME" : "no");
      if (!json_path.empty()) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& r : rows) {
          out.push_back({{"op", r.op}, {"bytes", r.bytes}, {"count", r.count}, {"dtype", r.dtype}, {"redop", r.redop},
                         {"placement", r.placement}, {"time_us", r.mean_us}, {"p50_us", r.p50_us},
                         {"p99_us", r.p99_us}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw}, {"wrong", r.wrong},
                         {"ranks", comm->size()}, {"device", device_name}, {"raw_gloo", r.raw && !cuda},
                         {"raw_nccl", r.raw && cuda},
                         {"baseline", gloo_native ? "gloo-native"
                                      : r.raw     ? (cuda ? "raw-nccl" : "same-algorithm")
                                                  : "comms"},
                         {"algorithm", r.algorithm}});
          if (overhead) {
            out.back()["overhead_baseline"] = cuda ? "raw-nccl" : "same-algorithm";
            out.back()["raw_p50_us"] = r.raw_p50_us;
            out.back()["raw_time_us"] = r.raw_mean_us;
            out.back()["overhead_us"] = r.p50_us - r.raw_p50_us;
            out.back()["overhead_pct"] = 100.0 * (r.p50_us - r.raw_p50_us) / r.raw_p50_us;
          }
        }
        std::ofstream(json_path) << out.dump(2) << "\n";
      }
    }
    raw.reset();
    if (cuda) cuda->close();  // the raw communicator before the comm's
    comm->finalize();
    return total_wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comms-bench: %s\n", e.what());
    return 1;
  }
}
