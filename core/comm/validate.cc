#include "util/strutil.h"
#include "comm/validate.h"

#include <cstdint>
#include <iterator>
#include <limits>
#include <type_traits>


namespace comms::internal {
namespace {

using plugin::OpType;

// The checks below run on every op. Each passing check is a compare inlined
// into its op's rules; the message of a failing one is built out of line
// (COMMS_COLD), so a passing op formats, allocates and returns nothing but
// one ok Status.
#define COMMS_COLD [[gnu::cold, gnu::noinline]]

COMMS_COLD Status invalid(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }

std::string describe(const BufferView& b) {
  return str::cat(b.count, " x ", to_string(b.dtype), " on ", b.device.to_string());
}

// Message parts that need formatting come as a callable, run only when the
// check fails.
template <class Text>
std::string text_of(const Text& t) {
  if constexpr (std::is_invocable_v<const Text&>) return t();
  else return std::string(t);
}

COMMS_COLD Status null_with_elements(const BufferView& b, std::string_view what) {
  return invalid(str::cat(what, " is null but has ", b.count, " elements"));
}

COMMS_COLD Status wrong_count(const BufferView& b, std::string_view what, size_t expected, std::string because) {
  return invalid(str::cat(what, " has ", b.count, " elements; expected ", expected, " (", because, ")"));
}

COMMS_COLD Status different_kind(const BufferView& a, const BufferView& b, std::string_view what_b) {
  if (a.dtype != b.dtype) {
    return invalid(str::cat(what_b, " is ", to_string(b.dtype), " but input is ", to_string(a.dtype)));
  }
  return invalid(str::cat(what_b, " is on ", b.device.to_string(), " but input is on ", a.device.to_string()));
}

COMMS_COLD Status undefined_reduction(const BufferView& b, const ReduceOp& op) {
  return {ErrorCode::kUnsupported,
          str::cat("reduce op '", to_string(op.kind), "' is not defined for ", to_string(b.dtype),
                   is_floating_point(b.dtype) ? " (bitwise ops need integer or bool types)"
                                              : " (avg and premul_sum need numeric types)")};
}

COMMS_COLD Status rank_out_of_range(int r, int size, std::string_view what) {
  return invalid(str::cat(what, " ", r, " is out of range [0, ", size, ")"));
}

// A view that is used must point somewhere when it has elements.
inline Status check_present(const BufferView& b, std::string_view what) {
  if (b.data == nullptr && b.count > 0) [[unlikely]] return null_with_elements(b, what);
  return {};
}

template <class Because>
inline Status check_count(const BufferView& b, std::string_view what, size_t expected, const Because& because) {
  if (b.count != expected) [[unlikely]] return wrong_count(b, what, expected, text_of(because));
  return {};
}

inline Status check_same_kind(const BufferView& a, const BufferView& b, std::string_view what_b) {
  if (a.dtype != b.dtype || a.device.type != b.device.type ||
      (a.device.index >= 0 && b.device.index >= 0 && a.device.index != b.device.index)) [[unlikely]] {
    return different_kind(a, b, what_b);
  }
  return {};
}

bool multiply_overflows(size_t a, size_t b) {
  return b != 0 && a > std::numeric_limits<size_t>::max() / b;
}

inline Status check_reduction(const BufferView& b, const ReduceOp& op) {
  if (!reduction_defined(b.dtype, op.kind)) [[unlikely]] return undefined_reduction(b, op);
  return {};
}

inline Status check_rank(int r, int size, std::string_view what) {
  if (r < 0 || r >= size) [[unlikely]] return rank_out_of_range(r, size, what);
  return {};
}

const char* byte(const void* p) { return static_cast<const char*>(p); }

// Whether [a, a+na) and [b, b+nb) overlap.
bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0 || a == nullptr || b == nullptr) return false;
  return byte(a) < byte(b) + nb && byte(b) < byte(a) + na;
}

Status sum_counts(std::span<const size_t> counts, int size, std::string_view what, size_t* sum) {
  if (counts.size() != static_cast<size_t>(size)) {
    return invalid(str::cat(what, " has ", counts.size(), " entries; expected one per rank (",
                                size, ")"));
  }
  size_t total = 0;
  for (size_t c : counts) {
    if (total > std::numeric_limits<size_t>::max() - c) return invalid(str::cat(what, " overflow"));
    total += c;
  }
  *sum = total;
  return {};
}

#define COMMS_RETURN_IF_ERROR(expr)              \
  do {                                           \
    Status _s = (expr);                          \
    if (!_s.is_ok()) [[unlikely]] return _s;     \
  } while (0)

// Each op's rules, one function per op (or per family sharing them): which
// buffers must be present and agree, their counts, the count the backend
// sees, and the in-place form it recognises.
struct Ctx {
  const OpArgs& a;
  int rank;
  int size;
  size_t es;  // element size of the input
};

// An output that aliases its input must be exactly the in-place form.
template <class Why>
inline Status check_aliasing(const BufferView& in, const BufferView& o, bool in_place, const Why& why) {
  if (!in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) [[unlikely]] return invalid(text_of(why));
  return {};
}

// all_reduce, reduce: output matches the input (only the root's for reduce);
// in place when they are the same buffer.
Status reduce_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  const bool is_root = x.a.type == OpType::kAllReduce || x.a.root == x.rank;
  if (x.a.type == OpType::kReduce) COMMS_RETURN_IF_ERROR(check_rank(x.a.root, x.size, "root"));
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_reduction(in, x.a.reduce));
  if (!is_root && o.data == nullptr) return {};
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count, "it must match the input"));
  out->in_place = in.data == o.data;
  return check_aliasing(in, o, out->in_place, "input and output overlap without being the same buffer");
}

// broadcast: one buffer, always in place.
Status broadcast_rules(const Ctx& x, Checked* out) {
  COMMS_RETURN_IF_ERROR(check_rank(x.a.root, x.size, "root"));
  COMMS_RETURN_IF_ERROR(check_present(x.a.input, "buffer"));
  out->in_place = true;
  return {};
}

// all_gather: output is size x input; in place when the input is this
// rank's slice of it.
Status all_gather_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  if (multiply_overflows(in.count, x.size)) return invalid("input count times world size overflows");
  COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count * x.size,
                                    [&] { return str::cat("input count ", in.count, " x world size ", x.size); }));
  out->in_place = in.count > 0 && byte(in.data) == byte(o.data) + x.rank * in.count * x.es;
  return check_aliasing(in, o, out->in_place,
                        [&] {
                          return str::cat("input overlaps output but is not its slice for rank ", x.rank,
                                          " (the in-place form)");
                        });
}

// all_gather (list form): one output per rank, each like the input; in
// place when this rank's output is the input.
Status all_gather_list_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  if (x.a.outputs.size() != static_cast<size_t>(x.size)) {
    return invalid(str::cat("outputs has ", x.a.outputs.size(), " buffers; expected one per rank (", x.size, ")"));
  }
  for (int r = 0; r < x.size; ++r) {
    const auto what = str::cat("outputs[", r, "]");
    COMMS_RETURN_IF_ERROR(check_present(x.a.outputs[r], what));
    COMMS_RETURN_IF_ERROR(check_same_kind(in, x.a.outputs[r], what));
    COMMS_RETURN_IF_ERROR(check_count(x.a.outputs[r], what, in.count, "it must match the input"));
  }
  out->in_place = in.count > 0 && x.a.outputs[x.rank].data == in.data;
  return {};
}

// The element offset of this rank's slice in a v-form buffer.
size_t slice_offset(std::span<const size_t> counts, int rank) {
  size_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += counts[r];
  return offset;
}

// all_gather_v: input is counts[rank], output the sum; in place when the
// input is this rank's slice.
Status all_gather_v_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  size_t total = 0;
  COMMS_RETURN_IF_ERROR(sum_counts(x.a.counts, x.size, "counts", &total));
  COMMS_RETURN_IF_ERROR(check_count(in, "input", x.a.counts[x.rank],
                                    [&] { return str::cat("counts[", x.rank, "] for this rank"); }));
  COMMS_RETURN_IF_ERROR(check_count(o, "output", total, "the sum of counts"));
  out->in_place = in.count > 0 && byte(in.data) == byte(o.data) + slice_offset(x.a.counts, x.rank) * x.es;
  return check_aliasing(in, o, out->in_place,
                        "input overlaps output but is not this rank's slice (the in-place form)");
}

// reduce_scatter: input is size x output; in place when the output is this
// rank's slice of the input.
Status reduce_scatter_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  COMMS_RETURN_IF_ERROR(check_reduction(in, x.a.reduce));
  if (multiply_overflows(o.count, x.size)) return invalid("output count times world size overflows");
  COMMS_RETURN_IF_ERROR(check_count(in, "input", o.count * x.size,
                                    [&] { return str::cat("output count ", o.count, " x world size ", x.size); }));
  out->count = o.count;
  out->in_place = o.count > 0 && byte(o.data) == byte(in.data) + x.rank * o.count * x.es;
  return check_aliasing(in, o, out->in_place,
                        [&] {
                          return str::cat("output overlaps input but is not its slice for rank ", x.rank,
                                          " (the in-place form)");
                        });
}

// reduce_scatter_v: input is the sum of counts, output counts[rank]; in
// place when the output is this rank's slice.
Status reduce_scatter_v_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  COMMS_RETURN_IF_ERROR(check_reduction(in, x.a.reduce));
  size_t total = 0;
  COMMS_RETURN_IF_ERROR(sum_counts(x.a.counts, x.size, "counts", &total));
  COMMS_RETURN_IF_ERROR(check_count(in, "input", total, "the sum of counts"));
  COMMS_RETURN_IF_ERROR(check_count(o, "output", x.a.counts[x.rank],
                                    [&] { return str::cat("counts[", x.rank, "] for this rank"); }));
  out->count = o.count;
  out->in_place = o.count > 0 && byte(o.data) == byte(in.data) + slice_offset(x.a.counts, x.rank) * x.es;
  return check_aliasing(in, o, out->in_place,
                        "output overlaps input but is not this rank's slice (the in-place form)");
}

// all_to_all: input and output alike, a multiple of the world size; in
// place when they are the same buffer.
Status all_to_all_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count, "it must match the input"));
  if (in.count % x.size != 0) {
    return invalid(str::cat("input has ", in.count, " elements, not a multiple of the world size ", x.size));
  }
  out->count = in.count / x.size;
  out->in_place = in.count > 0 && in.data == o.data;
  return check_aliasing(in, o, out->in_place, "input and output overlap without being the same buffer");
}

// all_to_all_v: input and output are the sums of their counts; in place
// when they are the same buffer.
Status all_to_all_v_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  size_t in_total = 0, out_total = 0;
  COMMS_RETURN_IF_ERROR(sum_counts(x.a.counts, x.size, "input_counts", &in_total));
  COMMS_RETURN_IF_ERROR(sum_counts(x.a.output_counts, x.size, "output_counts", &out_total));
  COMMS_RETURN_IF_ERROR(check_count(in, "input", in_total, "the sum of input_counts"));
  COMMS_RETURN_IF_ERROR(check_count(o, "output", out_total, "the sum of output_counts"));
  out->in_place = in.count > 0 && in.data == o.data;
  return check_aliasing(in, o, out->in_place, "input and output overlap without being the same buffer");
}

// gather: the root's output is size x input; in place when the input is
// the root's slice.
Status gather_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_rank(x.a.root, x.size, "root"));
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  if (x.rank != x.a.root) return {};
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
  if (multiply_overflows(in.count, x.size)) return invalid("input count times world size overflows");
  COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count * x.size,
                                    [&] { return str::cat("input count ", in.count, " x world size ", x.size); }));
  out->in_place = in.count > 0 && byte(in.data) == byte(o.data) + x.a.root * in.count * x.es;
  return check_aliasing(in, o, out->in_place, "input overlaps output but is not the root's slice (the in-place form)");
}

// scatter: described by its output; the root's input is size x output; in
// place when the output is the root's slice.
Status scatter_rules(const Ctx& x, Checked* out) {
  const BufferView& in = x.a.input;
  const BufferView& o = x.a.output;
  COMMS_RETURN_IF_ERROR(check_rank(x.a.root, x.size, "root"));
  COMMS_RETURN_IF_ERROR(check_present(o, "output"));
  out->dtype = o.dtype;
  out->device_type = o.device.type;
  out->count = o.count;
  if (x.rank != x.a.root) return {};
  COMMS_RETURN_IF_ERROR(check_present(in, "input"));
  COMMS_RETURN_IF_ERROR(check_same_kind(o, in, "input"));
  if (multiply_overflows(o.count, x.size)) return invalid("output count times world size overflows");
  COMMS_RETURN_IF_ERROR(check_count(in, "input", o.count * x.size,
                                    [&] { return str::cat("output count ", o.count, " x world size ", x.size); }));
  out->in_place = o.count > 0 && byte(o.data) == byte(in.data) + x.a.root * o.count * x.es;
  return check_aliasing(in, o, out->in_place, "output overlaps input but is not the root's slice (the in-place form)");
}

Status barrier_rules(const Ctx&, Checked* out) {
  out->count = 0;
  return {};
}

// send, recv: a peer other than this rank.
Status p2p_rules(const Ctx& x, Checked*) {
  COMMS_RETURN_IF_ERROR(check_rank(x.a.peer, x.size, "peer"));
  if (x.a.peer == x.rank) return invalid(str::cat("peer ", x.a.peer, " is this rank itself"));
  return check_present(x.a.input, "buffer");
}

// batch_p2p: each op like send/recv, all on one device type.
Status batch_p2p_rules(const Ctx& x, Checked* out) {
  out->count = 0;
  if (x.a.p2p.empty()) return {};
  const BufferView& first = x.a.p2p.front().buffer;
  out->dtype = first.dtype;
  out->device_type = first.device.type;
  for (size_t i = 0; i < x.a.p2p.size(); ++i) {
    const auto& op = x.a.p2p[i];
    const auto what = str::cat("ops[", i, "] (", op.kind == P2POp::Kind::kSend ? "send" : "recv", ")");
    COMMS_RETURN_IF_ERROR(check_rank(op.peer, x.size, str::cat(what, " peer")));
    if (op.peer == x.rank) return invalid(str::cat(what, " peer ", op.peer, " is this rank itself"));
    COMMS_RETURN_IF_ERROR(check_present(op.buffer, what));
    if (op.buffer.device.type != first.device.type) {
      return invalid(str::cat(what, " is on ", op.buffer.device.to_string(), " but ops[0] is on ",
                              first.device.to_string(), "; a batch runs on one device type"));
    }
  }
  return {};
}

using Rules = Status (*)(const Ctx&, Checked*);
struct OpRules {
  OpType type;
  Rules rules;
};

// Indexed by OpType (checked below).
constexpr OpRules kRules[] = {
    {OpType::kAllReduce, reduce_rules},
    {OpType::kReduce, reduce_rules},
    {OpType::kBroadcast, broadcast_rules},
    {OpType::kAllGather, all_gather_rules},
    {OpType::kAllGatherList, all_gather_list_rules},
    {OpType::kAllGatherV, all_gather_v_rules},
    {OpType::kReduceScatter, reduce_scatter_rules},
    {OpType::kReduceScatterV, reduce_scatter_v_rules},
    {OpType::kAllToAll, all_to_all_rules},
    {OpType::kAllToAllV, all_to_all_v_rules},
    {OpType::kGather, gather_rules},
    {OpType::kScatter, scatter_rules},
    {OpType::kBarrier, barrier_rules},
    {OpType::kSend, p2p_rules},
    {OpType::kRecv, p2p_rules},
    {OpType::kBatchP2P, batch_p2p_rules},
};

constexpr bool rules_in_order() {
  for (size_t i = 0; i < std::size(kRules); ++i) {
    if (static_cast<size_t>(kRules[i].type) != i) return false;
  }
  return std::size(kRules) == static_cast<size_t>(plugin::kNumOpTypes);
}
static_assert(rules_in_order(), "kRules must list every OpType, in enum order");

}  // namespace

Status validate(const OpArgs& a, int rank, int size, Checked* out) {
  const BufferView& in = a.input;
  out->dtype = in.dtype;
  out->device_type = in.device.type;
  out->in_place = false;
  out->count = in.count;
  const size_t index = static_cast<size_t>(a.type);
  if (index >= std::size(kRules)) {
    return invalid(str::cat("unknown op type ", static_cast<int>(a.type), " for ", describe(in)));
  }
  return kRules[index].rules(Ctx{a, rank, size, element_size(in.dtype)}, out);
}

Status check_device(const OpArgs& a, const Device& device, std::string_view backend) {
  if (device.index < 0) return {};
  // Runs on every op: the buffer's name is only formatted for an error.
  auto on_other = [&](const BufferView& b) {
    return b.device.type == device.type && b.device.index >= 0 && b.device.index != device.index;
  };
  auto refuse = [&](const BufferView& b, std::string_view what) {
    return invalid(str::cat(what, " is on ", b.device.to_string(), " but this comm's ", to_string(device.type),
                            " backend (", backend, ") is on ", device.to_string()));
  };
  if (on_other(a.input)) return refuse(a.input, "input");
  if (on_other(a.output)) return refuse(a.output, "output");
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    if (on_other(a.outputs[i])) return refuse(a.outputs[i], str::cat("outputs[", i, "]"));
  }
  for (size_t i = 0; i < a.p2p.size(); ++i) {
    const auto& op = a.p2p[i];
    if (on_other(op.buffer)) {
      return refuse(op.buffer, str::cat("ops[", i, "] (", op.kind == P2POp::Kind::kSend ? "send" : "recv", ")"));
    }
  }
  return {};
}

}  // namespace comms::internal
