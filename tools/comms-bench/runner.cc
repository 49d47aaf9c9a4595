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
  if (memory_ == HostMemory::kBackend && registered_in_.size() < in_.size()) {
    registered_in_ = BackendBuffer();  // the old pair goes before the new one is made
    registered_out_ = BackendBuffer();
    registered_in_ = BackendBuffer(comm_, in_.size());
    registered_out_ = BackendBuffer(comm_, out_.size());
  }
  if (memory_ == HostMemory::kHugePages && huge_in_.size() < in_.size()) {
    huge_in_ = HugePageBuffer();
    huge_out_ = HugePageBuffer();
    huge_in_ = HugePageBuffer(in_.size());
    huge_out_ = HugePageBuffer(out_.size());
    const size_t huge = huge_in_.huge_bytes() + huge_out_.huge_bytes();
    // Each whole 2 MiB page of the two buffers should be a huge one; fewer
    // means THP is off or memory fragmented, and the row measures 4 KiB pages.
    constexpr size_t kHugePage = size_t(2) << 20;
    const size_t whole = (in_.size() / kHugePage + out_.size() / kHugePage) * kHugePage;
    if (huge < whole && !warned_small_pages_) {
      warned_small_pages_ = true;
      std::fprintf(stderr,
                   "comms-bench: --huge-pages: rank %d has %zu of its %zu buffer bytes in huge pages "
                   "(/sys/kernel/mm/transparent_hugepage/enabled must be always or madvise)\n",
                   s.rank, huge, in_.size() + out_.size());
    }
  }
  s.in_base = cuda_ ? cuda_->input() : placed_in() ? placed_in() : in_.data();
  s.out_base = cuda_ ? cuda_->output() : placed_out() ? placed_out() : out_.data();
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
  if (placed_in()) {
    std::copy(in_.begin(), in_.end(), placed_in());
    std::copy(out_.begin(), out_.end(), placed_out());
  }
}

uint8_t* Bench::placed_in() const {
  if (cuda_) return nullptr;
  return memory_ == HostMemory::kBackend ? registered_in_.data()
         : memory_ == HostMemory::kHugePages ? huge_in_.data()
                                              : nullptr;
}

uint8_t* Bench::placed_out() const {
  if (cuda_) return nullptr;
  return memory_ == HostMemory::kBackend ? registered_out_.data()
         : memory_ == HostMemory::kHugePages ? huge_out_.data()
                                              : nullptr;
}

BenchOp Bench::op_of(const Shape& s) const {
  const size_t count = s.count, es = s.es;
  uint8_t* const in_base = s.in_base;
  BenchOp op;
  op.type = op_.type;
  op.input = in_base;
  op.output = s.in_place ? in_base : s.out_base;
  op.count = count;
  op.dtype = dtype_;
  op.redop = redop_;
  op.root = root_;
  op.peer = s.peer;
  op.device = s.device;
  op.stream = s.opts.stream;
  // In place, each op's input and output alias as OpDesc::in_place says.
  op.in_place = s.in_place;
  switch (op_.type) {
    case OpType::kBroadcast: op.output = in_base; op.in_place = true; break;
    case OpType::kAllGather:
      if (s.in_place) op.input = in_base + s.rank * count * es;
      break;
    case OpType::kReduceScatter:
      if (s.in_place) op.output = in_base + s.rank * count * es;
      break;
    case OpType::kGather:  // the root's own slice
      if (s.in_place && s.rank == root_) op.input = in_base + root_ * count * es;
      op.in_place = s.in_place && s.rank == root_;
      break;
    case OpType::kScatter:
      if (s.in_place && s.rank == root_) op.output = in_base + root_ * count * es;
      op.in_place = s.in_place && s.rank == root_;
      break;
    case OpType::kBarrier:
    case OpType::kSend: op.in_place = false; break;
    default: break;
  }
  return op;
}

void Bench::issue(const Shape& s, bool use_raw) {
  const BenchOp op = op_of(s);
  if (use_raw) return baseline_->run(op);
  const int n = s.n;
  const OpOptions& opts = s.opts;
  BufferView in{const_cast<void*>(op.input), op.count, dtype_, s.device};
  BufferView out{op.output, op.count, dtype_, s.device};
  switch (op_.type) {
    case OpType::kAllReduce: comm_->all_reduce(in, out, redop_, opts); break;
    case OpType::kReduce: comm_->reduce(in, out, root_, redop_, opts); break;
    case OpType::kBroadcast: comm_->broadcast(in, root_, opts); break;
    case OpType::kAllGather:
      out.count = op.count * n;
      comm_->all_gather(in, out, opts);
      break;
    case OpType::kReduceScatter:
      in.count = op.count * n;
      comm_->reduce_scatter(in, out, redop_, opts);
      break;
    case OpType::kAllToAll:
      in.count = out.count = op.count * n;
      comm_->all_to_all(in, out, opts);
      break;
    case OpType::kGather:
      out.count = op.count * n;
      comm_->gather(in, out, root_, opts);
      break;
    case OpType::kScatter:
      in.count = op.count * n;
      comm_->scatter(in, out, root_, opts);
      break;
    case OpType::kBarrier: comm_->barrier(opts); break;
    case OpType::kSend: {
      const P2POp ops[] = {P2POp::send(in, op.peer), P2POp::recv(out, op.peer)};
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
    if (placed_in()) {
      std::copy(placed_in(), placed_in() + in_.size(), in_.begin());
      std::copy(placed_out(), placed_out() + out_.size(), out_.begin());
    }
    wrong += count_wrong(s.count, s.in_place, s.rank, s.n, s.peer);
    fill(s);
  }
  comm_->all_reduce(BufferView::of(&wrong, 1), ReduceOp::sum());
  return wrong;
}

Row Bench::run(size_t bytes, bool in_place) {
  const Shape s = prepare(bytes, in_place);
  fill(s);
  // The timed op: the baseline for --raw-plugin, --gloo-native and
  // --raw-nccl, else comms; --overhead times both, alternating per
  // iteration so that noise hits them alike.
  const bool primary_raw = baseline_ && !overhead_;
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
  const std::optional<int64_t> zero_copy_before = memory_ == HostMemory::kBackend && !primary_raw ? zero_copy_ops() : std::nullopt;
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
  const std::optional<int64_t> zero_copy_after = zero_copy_before ? zero_copy_ops() : std::nullopt;
  Row row = summarize(s, times, raw_times, wrong, primary_raw);
  // The backend counted every timed op (warm-up too) on its zero-copy path.
  if (zero_copy_after && *zero_copy_after - *zero_copy_before == int64_t(warmup_ + iters_)) row.algorithm = "zero-copy";
  if (floor_) {
    std::tie(row.floor_us, row.floor_p99_us) = floor_p50_p99(s);
    row.floor_ratio = row.floor_us > 0 ? row.p50_us / row.floor_us : 0;
  }
  return row;
}

std::optional<int64_t> Bench::zero_copy_ops() const {
  return bench::zero_copy_ops(nlohmann::json::parse(comm_->describe(), nullptr, false), DeviceType::kCpu);
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
  Floor floor({op_.type, s.n, s.count, dtype_, redop_, root_, s.in_place, memory_ == HostMemory::kHugePages});
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
  row.algorithm = primary_raw ? baseline_->algorithm(op_of(s)) : paths_.path(plugin::op_name(op_.type), count * es);
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
