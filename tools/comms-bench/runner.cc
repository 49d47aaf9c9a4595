#include "runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <tuple>
#include <utility>
#include <stdexcept>

#include "comms/numeric.h"
#include "comms/store.h"
#include "floor.h"
#include "util/strutil.h"
#include <nlohmann/json.hpp>

namespace comms::bench {

using plugin::OpType;
using Clock = std::chrono::steady_clock;

Bench::Shape Bench::prepare(size_t bytes, bool in_place) {
  Shape s;
  s.n = comm_->size();
  s.rank = comm_->rank();
  s.es = element_size(dtype_);
  // count: the op's per-rank element count (OpDesc convention).
  s.count = bytes / s.es;
  if (op_.size_is_total) s.count /= static_cast<size_t>(s.n);
  s.big = op_.size_is_total ? s.count * s.n : s.count;
  s.in_place = in_place;
  in_.assign(s.big * s.es + 64, 0);
  out_.assign(s.big * s.es + 64, 0);
  // The host buffers are the device buffers' mirrors on cuda: filled and
  // checked here, copied on the bench's stream.
  if (cuda_) cuda_->reserve(in_.size());
  s.in_base = cuda_ ? cuda_->input() : in_.data();
  s.out_base = cuda_ ? cuda_->output() : out_.data();
  s.device = cuda_ ? Device::cuda(cuda_->device()) : Device::cpu();
  s.opts.stream = cuda_ ? cuda_->stream() : nullptr;
  s.peer = s.rank ^ 1;
  if (op_.type == OpType::kSend && s.peer >= s.n) throw std::invalid_argument("send_recv needs an even number of ranks");
  return s;
}

void Bench::fill(const Shape& s) {
  for (size_t i = 0; i < s.big; ++i) numeric::store_from_double(in_.data(), dtype_, i, double((s.rank + 1) + i % 3));
  if (s.in_place) std::copy(in_.begin(), in_.end(), out_.begin());
  if (cuda_) cuda_->upload(in_, out_);
}

void Bench::issue(const Shape& s, bool use_raw) {
  const size_t count = s.count, es = s.es;
  const int n = s.n, rank = s.rank, peer = s.peer;
  const bool in_place = s.in_place;
  uint8_t* const in_base = s.in_base;
  uint8_t* const out_base = s.out_base;
  const OpOptions& opts = s.opts;
  void* output = in_place ? in_base : out_base;
  if (use_raw && cuda_) {
    cuda_->run_raw(op_.type, in_base, output, count, dtype_, redop_, root_, peer);
    return;
  }
  if (use_raw) {
    raw_->run(op_.type, in_.data(), output, count, dtype_, redop_.kind, root_, peer);
    return;
  }
  BufferView in{in_base, count, dtype_, s.device};
  BufferView out{output, count, dtype_, s.device};
  switch (op_.type) {
    case OpType::kAllReduce: comm_->all_reduce(in, out, redop_, opts); break;
    case OpType::kReduce: comm_->reduce(in, out, root_, redop_, opts); break;
    case OpType::kBroadcast: comm_->broadcast(in, root_, opts); break;
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
      if (in_place && rank == root_) in.data = in_base + root_ * count * es;  // the root's own slice
      comm_->gather(in, out, root_, opts);
      break;
    case OpType::kScatter:
      in.count = count * n;
      if (in_place && rank == root_) out.data = in_base + root_ * count * es;
      comm_->scatter(in, out, root_, opts);
      break;
    case OpType::kBarrier: comm_->barrier(opts); break;
    case OpType::kSend: {
      const P2POp ops[] = {P2POp::send(in, peer), P2POp::recv(out, peer)};
      comm_->batch_p2p(ops, opts);
      break;
    }
    default: break;
  }
}

// On cuda an op is done when the bench's stream is (bench_cuda.h says why
// this and not events).
double Bench::timed(const Shape& s, bool use_raw) {
  const auto start = Clock::now();
  if (graph_ && cuda_->captured(use_raw)) {
    cuda_->replay(use_raw);
  } else {
    issue(s, use_raw);
  }
  if (cuda_) cuda_->synchronize();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

int64_t Bench::check(const Shape& s, bool primary_raw) {
  int64_t wrong = 0;
  // --overhead checks both sides.
  for (bool side : overhead_ ? std::vector<bool>{false, true} : std::vector<bool>{primary_raw}) {
    timed(s, side);
    if (cuda_) cuda_->download(in_, out_);
    wrong += count_wrong(s.count, s.in_place, s.rank, s.n, s.peer);
    fill(s);
  }
  comm_->all_reduce(BufferView::of(&wrong, 1), ReduceOp::sum());
  return wrong;
}

Row Bench::run(size_t bytes, bool in_place) {
  const Shape s = prepare(bytes, in_place);
  fill(s);
  // The timed op: raw Gloo for --raw-gloo, else comms; --overhead times
  // both, alternating per iteration so that noise hits them alike.
  const bool primary_raw = has_raw_ && !overhead_;
  if (graph_) {  // the last size's graphs: the check runs the op eagerly
    cuda_->uncapture(false);
    cuda_->uncapture(true);
  }
  const int64_t wrong = check_ ? check(s, primary_raw) : 0;
  if (graph_) {
    // One eager op first: a lazy comm connects outside the capture.
    for (bool side : overhead_ ? std::vector<bool>{false, true} : std::vector<bool>{primary_raw}) {
      timed(s, side);
      cuda_->capture(side, [&] { issue(s, side); });
    }
  }
  for (int i = 0; i < warmup_; ++i) {
    timed(s, primary_raw);
    if (overhead_) timed(s, true);
  }
  std::vector<double> times(static_cast<size_t>(iters_)), raw_times(overhead_ ? times.size() : 0);
  for (int i = 0; i < iters_; ++i) {
    const auto k = static_cast<size_t>(i);
    // Odd iterations run raw first, so neither side always follows the other.
    if (overhead_ && i % 2) raw_times[k] = timed(s, true);
    times[k] = timed(s, primary_raw);
    if (overhead_ && i % 2 == 0) raw_times[k] = timed(s, true);
  }
  Row row = summarize(s, times, raw_times, wrong, primary_raw);
  if (floor_) {
    std::tie(row.floor_us, row.floor_p99_us) = floor_p50_p99(s);
    row.floor_ratio = row.floor_us > 0 ? row.p50_us / row.floor_us : 0;
  }
  return row;
}

std::pair<double, double> Bench::floor_p50_p99(const Shape& s) {
  const std::string key = str::cat("comms-bench/floor/", floor_rows_++);
  const auto store = comm_->store();
  if (s.rank != 0) {
    // Rank 0's floor at the largest sizes takes about as long as the op's
    // own iterations; the op timeout alone could be shorter.
    const auto timeout = std::max<std::chrono::milliseconds>(comm_->op_timeout(), std::chrono::minutes(30));
    const std::string both = store->get(key, timeout);
    const size_t space = both.find(' ');
    return {std::stod(both.substr(0, space)), std::stod(both.substr(space + 1))};
  }
  Floor floor({op_.type, s.n, s.count, dtype_, redop_, root_, s.in_place});
  for (int r = 0; r < s.n; ++r) {  // the values fill() gives rank r
    for (size_t i = 0; i < floor.buffer_elements(); ++i) {
      numeric::store_from_double(floor.input(r), dtype_, i, double((r + 1) + i % 3));
    }
  }
  const auto per_thread = floor.time(warmup_, iters_);
  // Threads stand for ranks: an iteration's times combine as -a says.
  std::vector<double> times(per_thread[0].size());
  for (size_t i = 0; i < times.size(); ++i) {
    double sum = 0, lo = per_thread[0][i], hi = per_thread[0][i];
    for (const auto& t : per_thread) {
      sum += t[i];
      lo = std::min(lo, t[i]);
      hi = std::max(hi, t[i]);
    }
    times[i] = average_ == Average::kRank0 ? per_thread[0][i]
               : average_ == Average::kMean ? sum / double(per_thread.size())
               : average_ == Average::kMin  ? lo
                                            : hi;
  }
  std::sort(times.begin(), times.end());
  const double p50 = times[times.size() / 2];
  const double p99 = times[std::min(times.size() - 1, times.size() * 99 / 100)];  // as summarize()
  char text[64];
  std::snprintf(text, sizeof text, "%.17g %.17g", p50, p99);
  store->set(key, text);
  return {p50, p99};
}

namespace {
// The most bytes per rank the UCX plugin's shared-memory collectives take,
// from its describe() ("on, up to N bytes per rank"); 0 when they are off.
size_t ucx_shm_max(const Comm& comm) {
  try {
    const auto j = nlohmann::json::parse(comm.describe());
    const std::string state = j.at("backends").at("cpu").at("config").value("shm_collectives", "");
    const auto at = state.find("up to ");
    if (state.rfind("on", 0) != 0 || at == std::string::npos) return 0;
    return std::stoull(state.substr(at + 6));
  } catch (const std::exception&) {
    return 0;
  }
}

// Whether the UCX plugin copies directly with every peer (its describe()).
bool ucx_direct(const Comm& comm) {
  try {
    const auto j = nlohmann::json::parse(comm.describe());
    return j.at("backends").at("cpu").at("config").value("direct_copies", "").rfind("every peer", 0) == 0;
  } catch (const std::exception&) {
    return false;
  }
}

// The UCX plugin's choice (backends/ucx/ucx_backend.cc): the shared-memory
// collectives where the UCX plan (ucx_plan.h) says so (the same rules), else
// the CPU algorithms where algorithms.h picks one (with direct copies where
// every rank has them), else the pairwise exchange; point-to-point is UCP
// tag send/recv.
std::string ucx_algorithm(OpType type, size_t bytes, int n, size_t shm_max, bool direct) {
  if (type == OpType::kSend) return "ucp tag send/recv";
  const auto a = cpu_algorithms::fallback_of(type, cpu_algorithms::algorithm_for(type, bytes, n, /*in_place=*/true));
  using cpu_algorithms::Algorithm;
  if (direct && type == OpType::kAllReduce && a == Algorithm::kPipelinedRing &&
      cpu_algorithms::all_reduce_may_copy_directly(bytes, n)) {
    return "direct copies: each rank reduces its segment";
  }
  if (direct && type == OpType::kBroadcast && a == Algorithm::kBroadcast &&
      cpu_algorithms::broadcast_may_copy_directly(bytes)) {
    return "direct copies: root and receivers split";
  }
  const bool shm = shm_max > 0 && (type == OpType::kBarrier ||
                                   (type == OpType::kBroadcast && a == Algorithm::kBroadcast && bytes <= shm_max) ||
                                   ((type == OpType::kAllReduce || type == OpType::kAllGather) &&
                                    a == Algorithm::kExchange && bytes <= shm_max) ||
                                   (type == OpType::kReduceScatter && a == Algorithm::kExchange &&
                                    bytes * static_cast<size_t>(n) <= shm_max));
  if (shm) return "shm";
  return a != Algorithm::kNone ? std::string(cpu_algorithms::algorithm_name(type, a)) : "pairwise exchange";
}
}  // namespace

Row Bench::summarize(const Shape& s, std::vector<double>& times, std::vector<double>& raw_times, int64_t wrong,
                     bool primary_raw) const {
  const size_t count = s.count, es = s.es;
  const int n = s.n;
  combine_over_ranks(times);
  if (overhead_) combine_over_ranks(raw_times);
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  Row row;
  row.op = op_.name;
  row.dtype = std::string(to_string(dtype_));
  row.redop = to_string(redop_);
  row.placement = s.in_place ? "in-place" : "out-of-place";
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
                      ? std::string(gloo_backend::path_name(op_.type, gloo_backend::plan(op_.type, count * es, {n, true})))
                  : comm_->backends().backend_for(DeviceType::kCpu) == "ucx" ? ucx_algorithm(op_.type, count * es, n, ucx_shm_max(*comm_), ucx_direct(*comm_))
                                                                               : std::string();
  return row;
}

void Bench::combine_over_ranks(std::vector<double>& times) const {
  switch (average_) {
    case Average::kRank0: comm_->broadcast(BufferView::of(times), 0); break;
    case Average::kMean: comm_->all_reduce(BufferView::of(times), ReduceOp::avg()); break;
    case Average::kMin: comm_->all_reduce(BufferView::of(times), ReduceOp::min()); break;
    case Average::kMax: comm_->all_reduce(BufferView::of(times), ReduceOp::max()); break;
  }
}

// Checks the output against the closed form for the values fill() wrote.
int64_t Bench::count_wrong(size_t count, bool in_place, int rank, int n, int peer) const {
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
      if (rank == root_)
        for (size_t i = 0; i < count; ++i) wrong += !same(out, i, reduced(i));
      break;
    case OpType::kBroadcast:
      for (size_t i = 0; i < count; ++i) wrong += !same(in_.data(), i, value(root_, i));
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

}  // namespace comms::bench
