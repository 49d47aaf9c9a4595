// Every op of the Comm API on one group: dtype x reduce op x placement per
// case; inside a case, every count, every root, and sync / async / several
// async ops in flight.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "harness.h"

namespace comms::conformance {
namespace {

constexpr size_t kOddCount = 7;
constexpr size_t kLargeCount = 65536 + 5;  // large enough that backends chunk it
constexpr int kInFlight = 3;

// One issue of an op with its own buffers, checkable after it completed.
class Trial {
 public:
  virtual ~Trial() = default;
  virtual Work issue(Comm& c, const OpOptions& o) = 0;
  virtual void check(Checker& ck, Where where) = 0;
};
using MakeTrial = std::function<std::unique_ptr<Trial>(size_t count, int root, size_t salt)>;

struct Plan {
  std::vector<size_t> counts;
  std::vector<int> roots = {-1};
  // Async and several-in-flight runs; without, a single async run.
  bool all_modes = true;
};

void fail_with(Checker& ck, const Where& where, const Error& e) {
  ck.fail(where.describe() + ": unexpected error: " + e.what());
}

// Issues one trial and checks it; sync unless `async`.
void run_one(CaseContext& cx, const MakeTrial& make, Where w, size_t count, int root, size_t salt, bool async) {
  w.count = count;
  w.root = root;
  w.mode = async ? "async" : "sync";
  const OpOptions o = op_options(cx.memory, async);
  auto t = make(count, root, salt);
  try {
    t->issue(cx.comm, o).wait();
    t->check(cx.check, w);
  } catch (const Error& e) {
    fail_with(cx.check, w, e);
  }
}

// Every count at the first root, the odd count at every other root, then at
// the odd count and last root: one async op, and kInFlight async ops in
// flight together.
void run_plan(CaseContext& cx, const Where& base, const Plan& plan, const MakeTrial& make) {
  const size_t odd =
      std::find(plan.counts.begin(), plan.counts.end(), kOddCount) != plan.counts.end() ? kOddCount : plan.counts.back();
  for (size_t count : plan.counts) run_one(cx, make, base, count, plan.roots.front(), 0, false);
  for (size_t i = 1; i < plan.roots.size(); ++i) run_one(cx, make, base, odd, plan.roots[i], 0, false);
  const int root = plan.roots.back();
  run_one(cx, make, base, odd, root, 1, true);
  if (!plan.all_modes) return;

  Where w = base;
  w.count = odd;
  w.root = root;
  // Several ops in flight on one stream: wait() orders the stream after each,
  // and each check reads its buffers back on that stream.
  const OpOptions async = op_options(cx.memory, true);
  std::vector<std::unique_ptr<Trial>> trials;
  std::vector<Work> works;
  for (int k = 0; k < kInFlight; ++k) {
    trials.push_back(make(odd, root, 2 + k));
    try {
      works.push_back(trials.back()->issue(cx.comm, async));
    } catch (const Error& e) {
      w.mode = "inflight#" + std::to_string(k);
      fail_with(cx.check, w, e);
      works.emplace_back();
    }
  }
  for (int k = 0; k < kInFlight; ++k) {
    w.mode = "inflight#" + std::to_string(k);
    try {
      works[k].wait();
      trials[k]->check(cx.check, w);
    } catch (const Error& e) {
      fail_with(cx.check, w, e);
    }
  }
}

Where at(std::string op, DataType t, std::string redop) {
  Where w;
  w.op = std::move(op);
  w.dtype = t;
  w.redop = std::move(redop);
  return w;
}

// A null view on the suite's device (what a non-root passes for the root's buffer).
BufferView empty_view(DataType t, Device d) { return {nullptr, 0, t, d}; }

// --- reductions -------------------------------------------------------------

class AllReduceTrial : public Trial {
 public:
  AllReduceTrial(DeviceMemory& m, DataType t, ReduceOp op, bool in_place, int rank, int size, size_t count,
                 size_t salt)
      : op_(op), in_place_(in_place), size_(size), salt_(salt), rank_(rank), in_(m, t, count), out_(m, t, count) {
    for (size_t i = 0; i < count; ++i) in_.set(i, reduce_input(t, op.kind, rank, i + salt));
  }
  Work issue(Comm& c, const OpOptions& o) override {
    return in_place_ ? c.all_reduce(in_.view(), op_, o) : c.all_reduce(in_.view(), out_.view(), op_, o);
  }
  void check(Checker& ck, Where w) override {
    w.what = "output";
    ck.values(in_place_ ? in_ : out_, 0, in_.count(), w,
              [&](size_t i) { return expected_reduction(in_.dtype(), op_, size_, i + salt_); });
    if (!in_place_) {
      w.what = "input left intact";
      ck.values(in_, 0, in_.count(), w,
                [&](size_t i) { return reduce_input(in_.dtype(), op_.kind, rank_, i + salt_); });
    }
  }

 private:
  ReduceOp op_;
  bool in_place_;
  int size_;
  size_t salt_;
  int rank_;
  Buf in_, out_;
};

class ReduceTrial : public Trial {
 public:
  ReduceTrial(DeviceMemory& m, DataType t, ReduceOp op, bool in_place, int rank, int size, size_t count, int root,
              size_t salt)
      : op_(op), in_place_(in_place), rank_(rank), size_(size), root_(root), salt_(salt), in_(m, t, count),
        out_(m, t, count) {
    for (size_t i = 0; i < count; ++i) in_.set(i, reduce_input(t, op.kind, rank, i + salt));
  }
  Work issue(Comm& c, const OpOptions& o) override {
    return in_place_ ? c.reduce(in_.view(), root_, op_, o) : c.reduce(in_.view(), out_.view(), root_, op_, o);
  }
  void check(Checker& ck, Where w) override {
    if (rank_ != root_) return;  // the result is defined on the root only
    w.what = "output on the root";
    ck.values(in_place_ ? in_ : out_, 0, in_.count(), w,
              [&](size_t i) { return expected_reduction(in_.dtype(), op_, size_, i + salt_); });
  }

 private:
  ReduceOp op_;
  bool in_place_;
  int rank_, size_, root_;
  size_t salt_;
  Buf in_, out_;
};

// Unequal per-rank counts for the v-forms, with zero-sized ranks.
std::vector<size_t> uneven_counts(int size, size_t count) {
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = count == 0 || r % 3 == 1 ? 0 : count + r;
  return counts;
}

size_t offset_of(const std::vector<size_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, size_t(0));
}

// reduce_scatter (counts empty) and reduce_scatter_v.
class ReduceScatterTrial : public Trial {
 public:
  ReduceScatterTrial(DeviceMemory& m, DataType t, ReduceOp op, bool in_place, bool v, int rank, int size,
                     size_t count, size_t salt)
      : op_(op), in_place_(in_place), v_(v), rank_(rank), size_(size), salt_(salt) {
    counts_ = v ? uneven_counts(size, count) : std::vector<size_t>(size, count);
    const size_t total = std::accumulate(counts_.begin(), counts_.end(), size_t(0));
    in_ = Buf(m, t, total);
    out_ = Buf(m, t, counts_[rank]);
    for (size_t j = 0; j < total; ++j) in_.set(j, reduce_input(t, op.kind, rank, j + salt));
  }
  Work issue(Comm& c, const OpOptions& o) override {
    const BufferView out = in_place_ ? in_.view(offset_of(counts_, rank_), counts_[rank_]) : out_.view();
    return v_ ? c.reduce_scatter_v(in_.view(), out, counts_, op_, o) : c.reduce_scatter(in_.view(), out, op_, o);
  }
  void check(Checker& ck, Where w) override {
    w.what = "output";
    const size_t base = offset_of(counts_, rank_);
    ck.values(in_place_ ? in_ : out_, in_place_ ? base : 0, counts_[rank_], w,
              [&](size_t i) { return expected_reduction(in_.dtype(), op_, size_, base + i + salt_); });
  }

 private:
  ReduceOp op_;
  bool in_place_, v_;
  int rank_, size_;
  size_t salt_;
  std::vector<size_t> counts_;
  Buf in_, out_;
};

// --- data movement ----------------------------------------------------------

class BroadcastTrial : public Trial {
 public:
  BroadcastTrial(DeviceMemory& m, DataType t, int rank, size_t count, int root, size_t salt)
      : root_(root), salt_(salt), buf_(m, t, count) {
    for (size_t i = 0; i < count; ++i) buf_.set(i, data_value(t, rank, i + salt));
  }
  Work issue(Comm& c, const OpOptions& o) override { return c.broadcast(buf_.view(), root_, o); }
  void check(Checker& ck, Where w) override {
    w.what = "buffer";
    ck.values(buf_, 0, buf_.count(), w, [&](size_t i) { return data_value(buf_.dtype(), root_, i + salt_); });
  }

 private:
  int root_;
  size_t salt_;
  Buf buf_;
};

// all_gather (contiguous), all_gather (list) and all_gather_v.
class AllGatherTrial : public Trial {
 public:
  enum class Form { kContiguous, kList, kV };
  AllGatherTrial(DeviceMemory& m, DataType t, Form form, bool in_place, int rank, int size, size_t count,
                 size_t salt)
      : form_(form), in_place_(in_place), rank_(rank), salt_(salt) {
    counts_ = form == Form::kV ? uneven_counts(size, count) : std::vector<size_t>(size, count);
    const size_t mine = counts_[rank];
    in_ = Buf(m, t, mine);
    for (size_t i = 0; i < mine; ++i) in_.set(i, data_value(t, rank, i + salt));
    if (form == Form::kList) {
      for (int r = 0; r < size; ++r) parts_.emplace_back(m, t, count);
      if (in_place) {
        for (size_t i = 0; i < mine; ++i) parts_[rank].set(i, data_value(t, rank, i + salt));
      }
      for (auto& p : parts_) views_.push_back(p.view());
    } else {
      out_ = Buf(m, t, std::accumulate(counts_.begin(), counts_.end(), size_t(0)));
      if (in_place) {
        const size_t base = offset_of(counts_, rank);
        for (size_t i = 0; i < mine; ++i) out_.set(base + i, data_value(t, rank, i + salt));
      }
    }
  }
  Work issue(Comm& c, const OpOptions& o) override {
    const size_t mine = counts_[rank_];
    switch (form_) {
      case Form::kList:
        return c.all_gather(in_place_ ? parts_[rank_].view() : in_.view(), views_, o);
      case Form::kContiguous:
        return c.all_gather(in_place_ ? out_.view(rank_ * mine, mine) : in_.view(), out_.view(), o);
      case Form::kV:
        return c.all_gather_v(in_place_ ? out_.view(offset_of(counts_, rank_), mine) : in_.view(), out_.view(),
                              counts_, o);
    }
    return {};
  }
  void check(Checker& ck, Where w) override {
    const DataType t = in_.dtype();
    for (size_t r = 0; r < counts_.size(); ++r) {
      w.what = "block from group rank " + std::to_string(r);
      auto expect = [&](size_t i) { return data_value(t, int(r), i + salt_); };
      if (form_ == Form::kList) ck.values(parts_[r], 0, counts_[r], w, expect);
      else ck.values(out_, offset_of(counts_, int(r)), counts_[r], w, expect);
    }
  }

 private:
  Form form_;
  bool in_place_;
  int rank_;
  size_t salt_;
  std::vector<size_t> counts_;
  Buf in_, out_;
  std::vector<Buf> parts_;
  std::vector<BufferView> views_;
};

// all_to_all (equal blocks) and all_to_all_v (symmetric uneven blocks, so
// that the in-place form has the same layout for input and output).
class AllToAllTrial : public Trial {
 public:
  AllToAllTrial(DeviceMemory& m, DataType t, bool v, bool in_place, int rank, int size, size_t count, size_t salt)
      : v_(v), in_place_(in_place), rank_(rank), size_(size), count_(count), salt_(salt) {
    for (int d = 0; d < size; ++d) {
      send_counts_.push_back(block(rank, d));
      recv_counts_.push_back(block(d, rank));
    }
    in_ = Buf(m, t, std::accumulate(send_counts_.begin(), send_counts_.end(), size_t(0)));
    out_ = Buf(m, t, std::accumulate(recv_counts_.begin(), recv_counts_.end(), size_t(0)));
    for (int d = 0; d < size; ++d) {
      const size_t base = offset_of(send_counts_, d);
      for (size_t i = 0; i < send_counts_[d]; ++i) in_.set(base + i, data_value(t, rank, tag(d, i)));
    }
  }
  Work issue(Comm& c, const OpOptions& o) override {
    const BufferView out = in_place_ ? in_.view() : out_.view();
    return v_ ? c.all_to_all_v(in_.view(), send_counts_, out, recv_counts_, o) : c.all_to_all(in_.view(), out, o);
  }
  void check(Checker& ck, Where w) override {
    const Buf& got = in_place_ ? in_ : out_;
    for (int s = 0; s < size_; ++s) {
      w.what = "block from group rank " + std::to_string(s);
      ck.values(got, offset_of(recv_counts_, s), recv_counts_[s], w,
                [&](size_t i) { return data_value(in_.dtype(), s, tag(rank_, i)); });
    }
  }

 private:
  size_t block(int src, int dst) const {
    if (!v_) return count_;
    return count_ == 0 ? 0 : (count_ + src + dst) % (count_ + 2);
  }
  // Encodes the destination and index, so a block sent to the wrong rank shows.
  size_t tag(int dst, size_t i) const { return size_t(dst) * 1009 + i + salt_; }

  bool v_, in_place_;
  int rank_, size_;
  size_t count_, salt_;
  std::vector<size_t> send_counts_, recv_counts_;
  Buf in_, out_;
};

class GatherTrial : public Trial {
 public:
  GatherTrial(DeviceMemory& m, DataType t, bool in_place, int rank, int size, size_t count, int root, size_t salt)
      : in_place_(in_place), rank_(rank), size_(size), root_(root), salt_(salt), in_(m, t, count),
        out_(m, t, rank == root ? count * size : 0) {
    for (size_t i = 0; i < count; ++i) in_.set(i, data_value(t, rank, i + salt));
    if (rank == root && in_place) {
      for (size_t i = 0; i < count; ++i) out_.set(root * count + i, data_value(t, rank, i + salt));
    }
  }
  Work issue(Comm& c, const OpOptions& o) override {
    const size_t n = in_.count();
    if (rank_ != root_) {
      const BufferView in = in_.view();
      return c.gather(in, empty_view(in_.dtype(), in.device), root_, o);
    }
    return c.gather(in_place_ ? out_.view(root_ * n, n) : in_.view(), out_.view(), root_, o);
  }
  void check(Checker& ck, Where w) override {
    if (rank_ != root_) return;
    const size_t n = in_.count();
    for (int r = 0; r < size_; ++r) {
      w.what = "block from group rank " + std::to_string(r);
      ck.values(out_, r * n, n, w, [&](size_t i) { return data_value(in_.dtype(), r, i + salt_); });
    }
  }

 private:
  bool in_place_;
  int rank_, size_, root_;
  size_t salt_;
  Buf in_, out_;
};

class ScatterTrial : public Trial {
 public:
  ScatterTrial(DeviceMemory& m, DataType t, bool in_place, int rank, int size, size_t count, int root, size_t salt)
      : in_place_(in_place), rank_(rank), root_(root), salt_(salt), in_(m, t, rank == root ? count * size : 0),
        out_(m, t, count) {
    for (size_t j = 0; j < in_.count(); ++j) in_.set(j, data_value(t, root, j + salt));
  }
  Work issue(Comm& c, const OpOptions& o) override {
    const size_t n = out_.count();
    if (rank_ != root_) {
      const BufferView out = out_.view();
      return c.scatter(empty_view(out_.dtype(), out.device), out, root_, o);
    }
    return c.scatter(in_.view(), in_place_ ? in_.view(root_ * n, n) : out_.view(), root_, o);
  }
  void check(Checker& ck, Where w) override {
    const size_t n = out_.count();
    const bool from_input = in_place_ && rank_ == root_;
    w.what = "output";
    ck.values(from_input ? in_ : out_, from_input ? rank_ * n : 0, n, w,
              [&](size_t i) { return data_value(out_.dtype(), root_, rank_ * n + i + salt_); });
  }

 private:
  bool in_place_;
  int rank_, root_;
  size_t salt_;
  Buf in_, out_;
};

class BarrierTrial : public Trial {
 public:
  Work issue(Comm& c, const OpOptions& o) override { return c.barrier(o); }
  void check(Checker&, Where) override {}
};

// A ring: every rank sends to its right and receives from its left, together.
class BatchP2PTrial : public Trial {
 public:
  BatchP2PTrial(DeviceMemory& m, DataType t, int rank, int size, size_t count, size_t salt)
      : left_((rank + size - 1) % size), right_((rank + 1) % size), salt_(salt), send_(m, t, count),
        recv_(m, t, count) {
    for (size_t i = 0; i < count; ++i) send_.set(i, data_value(t, rank, i + salt));
  }
  Work issue(Comm& c, const OpOptions& o) override {
    // The views are taken at issue, when the buffers go to the device.
    const std::vector<P2POp> ops = {P2POp::send(send_.view(), right_), P2POp::recv(recv_.view(), left_)};
    return c.batch_p2p(ops, o);
  }
  void check(Checker& ck, Where w) override {
    w.what = "received from group rank " + std::to_string(left_);
    ck.values(recv_, 0, recv_.count(), w, [&](size_t i) { return data_value(recv_.dtype(), left_, i + salt_); });
  }

 private:
  int left_, right_;
  size_t salt_;
  Buf send_, recv_;
};

// Pairs (0,1), (2,3), ...: the even rank sends first, the odd one receives
// first, so blocking send and recv cannot deadlock. An unpaired last rank idles.
void run_send_recv(CaseContext& cx, DataType t, const std::vector<size_t>& counts) {
  const int rank = cx.comm.rank();
  const int partner = rank ^ 1;
  if (partner >= cx.comm.size()) return;
  for (size_t count : counts) {
    for (bool async : {false, true}) {
      Where w = at("send/recv", t, "");
      w.count = count;
      w.mode = async ? "async" : "sync";
      Buf out(cx.memory, t, count), in(cx.memory, t, count);
      for (size_t i = 0; i < count; ++i) out.set(i, data_value(t, rank, i));
      OpOptions o = op_options(cx.memory, async);
      o.tag = 7;
      try {
        if (rank % 2 == 0) {
          cx.comm.send(out.view(), partner, o).wait();
          cx.comm.recv(in.view(), partner, o).wait();
        } else {
          cx.comm.recv(in.view(), partner, o).wait();
          cx.comm.send(out.view(), partner, o).wait();
        }
        w.what = "received from group rank " + std::to_string(partner);
        cx.check.values(in, 0, count, w, [&](size_t i) { return data_value(t, partner, i); });
      } catch (const Error& e) {
        fail_with(cx.check, w, e);
      }
    }
  }
}

// A send reaches its receiver while the sender does nothing more with the
// comm (it computes, sleeps or waits on another comm): a backend that leaves
// a large send in flight after the call returned must move it along by
// itself. The receive's timeout ends well inside the sender's pause.
void run_send_from_an_idle_sender(CaseContext& cx) {
  const int rank = cx.comm.rank();
  const int partner = rank ^ 1;
  if (partner >= cx.comm.size()) return;
  constexpr size_t kCount = 256 * 1024;  // 1 MiB of float32: past every eager limit
  constexpr auto kPause = std::chrono::milliseconds(1500);
  const DataType t = DataType::kFloat32;
  Where w = at("send_from_an_idle_sender", t, "");
  w.count = kCount;
  w.mode = "sync";
  Buf out(cx.memory, t, kCount), in(cx.memory, t, kCount);
  for (size_t i = 0; i < kCount; ++i) out.set(i, data_value(t, rank, i));
  OpOptions o = op_options(cx.memory);
  try {
    if (rank % 2 == 0) {
      cx.comm.send(out.view(), partner, o);
      std::this_thread::sleep_for(kPause);
    } else {
      o.timeout = kPause * 2 / 3;
      cx.comm.recv(in.view(), partner, o);
      w.what = "received from group rank " + std::to_string(partner) + " while it was idle";
      cx.check.values(in, 0, kCount, w, [&](size_t i) { return data_value(t, partner, i); });
    }
  } catch (const Error& e) {
    fail_with(cx.check, w, e);
  }
}

// --- case enumeration -------------------------------------------------------

std::string placement_name(bool in_place) { return in_place ? "in-place" : "out-of-place"; }

struct Adder {
  const Group& group;
  const SuiteOptions& options;
  std::vector<Case>* cases;

  void add(const std::string& op, const std::string& rest, std::string skip,
           std::function<void(CaseContext&)> body) {
    Case c;
    c.name = group.shape + "/" + op + "/" + rest;
    c.group = op;
    c.skip_reason = std::move(skip);
    c.body = std::move(body);
    cases->push_back(std::move(c));
  }
};

}  // namespace

void add_op_cases(const Group& group, const Capabilities& caps, const SuiteOptions& options,
                  std::vector<Case>* cases) {
  Adder adder{group, options, cases};
  const bool world = group.shape == "world";
  const bool quick = options.quick;
  // First: after large ops UCX may pick a protocol that needs no progress
  // from the sender, which would hide a backend that never gives it any.
  if (world) {  // a property of the backend, not of rank mapping: once per suite
    const bool pairs = !group.group_sizes.empty() &&
                       *std::max_element(group.group_sizes.begin(), group.group_sizes.end()) >= 2;
    adder.add("send_from_an_idle_sender", "float32", pairs ? "" : "p2p needs a group of 2 or more ranks",
              [=](CaseContext& cx) {
                if (cx.comm.size() < 2) return;
                run_send_from_an_idle_sender(cx);
              });
  }
  // The world gets the full sweep (zero and large counts, every root, every
  // mode); subgroups, which check that ranks map right, a lighter one, so the
  // suite stays within minutes at every world size on a small machine.
  std::vector<size_t> counts;
  if (world) counts = quick ? std::vector<size_t>{0, 1, kOddCount} : std::vector<size_t>{0, 1, kOddCount, kLargeCount};
  else counts = quick ? std::vector<size_t>{kOddCount} : std::vector<size_t>{1, kOddCount};
  auto plan_for = [=](const Comm& c, bool rooted) {
    Plan p{counts};
    p.all_modes = world;
    if (rooted) {
      p.roots.clear();
      for (int r = 0; r < c.size(); ++r) {
        if ((world && !quick) || r == 0 || r == c.size() - 1) p.roots.push_back(r);
      }
      if (!world && quick) p.roots = {c.size() - 1};
    }
    return p;
  };
  // --quick sweeps a few representative types on subgroups.
  auto wanted = [&](DataType t) {
    if (world || !quick) return true;
    return t == DataType::kInt8 || t == DataType::kUint64 || t == DataType::kFloat32 || t == DataType::kBfloat16 ||
           t == DataType::kFloat8E5M2 || t == DataType::kBool;
  };

  for (DataType t : all_data_types()) {
    if (!wanted(t)) continue;
    const std::string dt(to_string(t));
    for (const ReduceOp& op : reductions_for(t)) {
      const std::string skip = caps.unsupported_reason(t, op);
      const std::string rn = reduce_name(op);
      for (bool in_place : {false, true}) {
        const std::string rest = dt + "/" + rn + "/" + placement_name(in_place);
        adder.add("all_reduce", rest, skip, [=](CaseContext& cx) {
          Plan plan = plan_for(cx.comm, false);
          run_plan(cx, at("all_reduce", t, rn), plan, [&](size_t n, int, size_t salt) {
            return std::make_unique<AllReduceTrial>(cx.memory, t, op, in_place, cx.comm.rank(), cx.comm.size(), n, salt);
          });
        });
        adder.add("reduce", rest, skip, [=](CaseContext& cx) {
          Plan plan = plan_for(cx.comm, true);
          run_plan(cx, at("reduce", t, rn), plan, [&](size_t n, int root, size_t salt) {
            return std::make_unique<ReduceTrial>(cx.memory, t, op, in_place, cx.comm.rank(), cx.comm.size(), n, root, salt);
          });
        });
        for (bool v : {false, true}) {
          const std::string name = v ? "reduce_scatter_v" : "reduce_scatter";
          adder.add(name, rest, skip, [=](CaseContext& cx) {
            Plan plan = plan_for(cx.comm, false);
            run_plan(cx, at(name, t, rn), plan, [&](size_t n, int, size_t salt) {
              return std::make_unique<ReduceScatterTrial>(cx.memory, t, op, in_place, v, cx.comm.rank(), cx.comm.size(), n,
                                                          salt);
            });
          });
        }
      }
    }

    adder.add("broadcast", dt + "/in-place", "", [=](CaseContext& cx) {
      Plan plan = plan_for(cx.comm, true);
      run_plan(cx, at("broadcast", t, ""), plan, [&](size_t n, int root, size_t salt) {
        return std::make_unique<BroadcastTrial>(cx.memory, t, cx.comm.rank(), n, root, salt);
      });
    });
    for (bool in_place : {false, true}) {
      const std::string rest = dt + "/" + placement_name(in_place);
      using Form = AllGatherTrial::Form;
      for (auto [form, name] : {std::pair{Form::kContiguous, "all_gather"}, std::pair{Form::kList, "all_gather_list"},
                                std::pair{Form::kV, "all_gather_v"}}) {
        adder.add(name, rest, "", [=](CaseContext& cx) {
          Plan plan = plan_for(cx.comm, false);
          run_plan(cx, at(name, t, ""), plan, [&](size_t n, int, size_t salt) {
            return std::make_unique<AllGatherTrial>(cx.memory, t, form, in_place, cx.comm.rank(), cx.comm.size(), n, salt);
          });
        });
      }
      for (bool v : {false, true}) {
        const std::string name = v ? "all_to_all_v" : "all_to_all";
        adder.add(name, rest, "", [=](CaseContext& cx) {
          Plan plan = plan_for(cx.comm, false);
          run_plan(cx, at(name, t, ""), plan, [&](size_t n, int, size_t salt) {
            return std::make_unique<AllToAllTrial>(cx.memory, t, v, in_place, cx.comm.rank(), cx.comm.size(), n, salt);
          });
        });
      }
      adder.add("gather", rest, "", [=](CaseContext& cx) {
        Plan plan = plan_for(cx.comm, true);
        run_plan(cx, at("gather", t, ""), plan, [&](size_t n, int root, size_t salt) {
          return std::make_unique<GatherTrial>(cx.memory, t, in_place, cx.comm.rank(), cx.comm.size(), n, root, salt);
        });
      });
      adder.add("scatter", rest, "", [=](CaseContext& cx) {
        Plan plan = plan_for(cx.comm, true);
        run_plan(cx, at("scatter", t, ""), plan, [&](size_t n, int root, size_t salt) {
          return std::make_unique<ScatterTrial>(cx.memory, t, in_place, cx.comm.rank(), cx.comm.size(), n, root, salt);
        });
      });
    }

    // Point to point needs a peer: groups of one rank have none (the API
    // rejects a rank sending to itself), and they sit these cases out.
    const int largest = group.group_sizes.empty()
                            ? 0
                            : *std::max_element(group.group_sizes.begin(), group.group_sizes.end());
    const std::string p2p_skip = largest < 2 ? "p2p needs a group of 2 or more ranks" : "";
    adder.add("send_recv", dt, p2p_skip, [=](CaseContext& cx) {
      if (cx.comm.size() < 2) return;
      run_send_recv(cx, t, counts);
    });
    adder.add("batch_p2p", dt, p2p_skip, [=](CaseContext& cx) {
      if (cx.comm.size() < 2) return;
      Plan plan = plan_for(cx.comm, false);
      run_plan(cx, at("batch_p2p", t, ""), plan, [&](size_t n, int, size_t salt) {
        return std::make_unique<BatchP2PTrial>(cx.memory, t, cx.comm.rank(), cx.comm.size(), n, salt);
      });
    });
  }
  adder.add("barrier", "none", "", [=](CaseContext& cx) {
    Plan plan = plan_for(cx.comm, false);
    plan.counts = {kOddCount};  // a barrier has no count; this runs it once per mode
    run_plan(cx, at("barrier", DataType::kUint8, ""), plan,
             [&](size_t, int, size_t) { return std::make_unique<BarrierTrial>(); });
  });
}

}  // namespace comms::conformance
