#include "strutil.h"
#include "validate.h"

#include <cstdint>
#include <limits>


namespace comms::internal {
namespace {

using plugin::OpType;

Status invalid(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }

std::string describe(const BufferView& b) {
  return str::cat(b.count, " x ", to_string(b.dtype), " on ", b.device.to_string());
}

// A view that is used must point somewhere when it has elements.
Status check_present(const BufferView& b, std::string_view what) {
  if (b.data == nullptr && b.count > 0) {
    return invalid(str::cat(what, " is null but has ", b.count, " elements"));
  }
  return {};
}

Status check_count(const BufferView& b, std::string_view what, size_t expected,
                   std::string_view because) {
  if (b.count != expected) {
    return invalid(str::cat(what, " has ", b.count, " elements; expected ", expected, " (",
                                because, ")"));
  }
  return {};
}

Status check_same_kind(const BufferView& a, const BufferView& b, std::string_view what_b) {
  if (a.dtype != b.dtype) {
    return invalid(str::cat(what_b, " is ", to_string(b.dtype), " but input is ",
                                to_string(a.dtype)));
  }
  if (a.device.type != b.device.type || (a.device.index >= 0 && b.device.index >= 0 &&
                                          a.device.index != b.device.index)) {
    return invalid(str::cat(what_b, " is on ", b.device.to_string(), " but input is on ",
                                a.device.to_string()));
  }
  return {};
}

bool multiply_overflows(size_t a, size_t b) {
  return b != 0 && a > std::numeric_limits<size_t>::max() / b;
}

Status check_reduction(const BufferView& b, const ReduceOp& op) {
  if (!reduction_defined(b.dtype, op.kind)) {
    return {ErrorCode::kUnsupported,
            str::cat("reduce op '", to_string(op.kind), "' is not defined for ",
                         to_string(b.dtype),
                         is_floating_point(b.dtype) ? " (bitwise ops need integer or bool types)"
                                                    : " (avg and premul_sum need numeric types)")};
  }
  return {};
}

Status check_rank(int r, int size, std::string_view what) {
  if (r < 0 || r >= size) {
    return invalid(str::cat(what, " ", r, " is out of range [0, ", size, ")"));
  }
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

#define COMMS_RETURN_IF_ERROR(expr)     \
  do {                                  \
    Status _s = (expr);                 \
    if (!_s.is_ok()) return _s;         \
  } while (0)

}  // namespace

Status validate(const OpArgs& a, int rank, int size, Checked* out) {
  const BufferView& in = a.input;
  const BufferView& o = a.output;
  out->dtype = in.dtype;
  out->device_type = in.device.type;
  out->in_place = false;
  out->count = in.count;
  const size_t es = element_size(in.dtype);

  switch (a.type) {
    case OpType::kAllReduce:
    case OpType::kReduce: {
      const bool is_root = a.type == OpType::kAllReduce || a.root == rank;
      if (a.type == OpType::kReduce) COMMS_RETURN_IF_ERROR(check_rank(a.root, size, "root"));
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_reduction(in, a.reduce));
      if (is_root || o.data != nullptr) {
        COMMS_RETURN_IF_ERROR(check_present(o, "output"));
        COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
        COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count, "it must match the input"));
        out->in_place = in.data == o.data;
        if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
          return invalid("input and output overlap without being the same buffer");
        }
      }
      return {};
    }
    case OpType::kBroadcast:
      COMMS_RETURN_IF_ERROR(check_rank(a.root, size, "root"));
      COMMS_RETURN_IF_ERROR(check_present(in, "buffer"));
      out->in_place = true;
      return {};
    case OpType::kAllGather: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
      if (multiply_overflows(in.count, size)) return invalid("input count times world size overflows");
      COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count * size,
                                        str::cat("input count ", in.count, " x world size ", size)));
      out->in_place = in.count > 0 && byte(in.data) == byte(o.data) + rank * in.count * es;
      if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
        return invalid(str::cat("input overlaps output but is not its slice for rank ", rank,
                                    " (the in-place form)"));
      }
      return {};
    }
    case OpType::kAllGatherList: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      if (a.outputs.size() != static_cast<size_t>(size)) {
        return invalid(str::cat("outputs has ", a.outputs.size(),
                                    " buffers; expected one per rank (", size, ")"));
      }
      for (int r = 0; r < size; ++r) {
        const auto what = str::cat("outputs[", r, "]");
        COMMS_RETURN_IF_ERROR(check_present(a.outputs[r], what));
        COMMS_RETURN_IF_ERROR(check_same_kind(in, a.outputs[r], what));
        COMMS_RETURN_IF_ERROR(check_count(a.outputs[r], what, in.count, "it must match the input"));
      }
      out->in_place = in.count > 0 && a.outputs[rank].data == in.data;
      return {};
    }
    case OpType::kAllGatherV: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
      size_t total = 0;
      COMMS_RETURN_IF_ERROR(sum_counts(a.counts, size, "counts", &total));
      COMMS_RETURN_IF_ERROR(check_count(in, "input", a.counts[rank],
                                        str::cat("counts[", rank, "] for this rank")));
      COMMS_RETURN_IF_ERROR(check_count(o, "output", total, "the sum of counts"));
      size_t offset = 0;
      for (int r = 0; r < rank; ++r) offset += a.counts[r];
      out->in_place = in.count > 0 && byte(in.data) == byte(o.data) + offset * es;
      if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
        return invalid("input overlaps output but is not this rank's slice (the in-place form)");
      }
      return {};
    }
    case OpType::kReduceScatter: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
      COMMS_RETURN_IF_ERROR(check_reduction(in, a.reduce));
      if (multiply_overflows(o.count, size)) return invalid("output count times world size overflows");
      COMMS_RETURN_IF_ERROR(check_count(in, "input", o.count * size,
                                        str::cat("output count ", o.count, " x world size ", size)));
      out->count = o.count;
      out->in_place = o.count > 0 && byte(o.data) == byte(in.data) + rank * o.count * es;
      if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
        return invalid(str::cat("output overlaps input but is not its slice for rank ", rank,
                                    " (the in-place form)"));
      }
      return {};
    }
    case OpType::kReduceScatterV: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
      COMMS_RETURN_IF_ERROR(check_reduction(in, a.reduce));
      size_t total = 0;
      COMMS_RETURN_IF_ERROR(sum_counts(a.counts, size, "counts", &total));
      COMMS_RETURN_IF_ERROR(check_count(in, "input", total, "the sum of counts"));
      COMMS_RETURN_IF_ERROR(check_count(o, "output", a.counts[rank],
                                        str::cat("counts[", rank, "] for this rank")));
      size_t offset = 0;
      for (int r = 0; r < rank; ++r) offset += a.counts[r];
      out->count = o.count;
      out->in_place = o.count > 0 && byte(o.data) == byte(in.data) + offset * es;
      if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
        return invalid("output overlaps input but is not this rank's slice (the in-place form)");
      }
      return {};
    }
    case OpType::kAllToAll: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
      COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count, "it must match the input"));
      if (in.count % size != 0) {
        return invalid(str::cat("input has ", in.count, " elements, not a multiple of the world size ",
                                    size));
      }
      out->count = in.count / size;
      out->in_place = in.count > 0 && in.data == o.data;
      if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
        return invalid("input and output overlap without being the same buffer");
      }
      return {};
    }
    case OpType::kAllToAllV: {
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
      size_t in_total = 0, out_total = 0;
      COMMS_RETURN_IF_ERROR(sum_counts(a.counts, size, "input_counts", &in_total));
      COMMS_RETURN_IF_ERROR(sum_counts(a.output_counts, size, "output_counts", &out_total));
      COMMS_RETURN_IF_ERROR(check_count(in, "input", in_total, "the sum of input_counts"));
      COMMS_RETURN_IF_ERROR(check_count(o, "output", out_total, "the sum of output_counts"));
      out->in_place = in.count > 0 && in.data == o.data;
      if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
        return invalid("input and output overlap without being the same buffer");
      }
      return {};
    }
    case OpType::kGather: {
      COMMS_RETURN_IF_ERROR(check_rank(a.root, size, "root"));
      COMMS_RETURN_IF_ERROR(check_present(in, "input"));
      if (rank == a.root) {
        COMMS_RETURN_IF_ERROR(check_present(o, "output"));
        COMMS_RETURN_IF_ERROR(check_same_kind(in, o, "output"));
        if (multiply_overflows(in.count, size)) return invalid("input count times world size overflows");
        COMMS_RETURN_IF_ERROR(check_count(o, "output", in.count * size,
                                          str::cat("input count ", in.count, " x world size ", size)));
        out->in_place = in.count > 0 && byte(in.data) == byte(o.data) + a.root * in.count * es;
        if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
          return invalid("input overlaps output but is not the root's slice (the in-place form)");
        }
      }
      return {};
    }
    case OpType::kScatter: {
      COMMS_RETURN_IF_ERROR(check_rank(a.root, size, "root"));
      COMMS_RETURN_IF_ERROR(check_present(o, "output"));
      out->dtype = o.dtype;
      out->device_type = o.device.type;
      out->count = o.count;
      if (rank == a.root) {
        COMMS_RETURN_IF_ERROR(check_present(in, "input"));
        COMMS_RETURN_IF_ERROR(check_same_kind(o, in, "input"));
        if (multiply_overflows(o.count, size)) return invalid("output count times world size overflows");
        COMMS_RETURN_IF_ERROR(check_count(in, "input", o.count * size,
                                          str::cat("output count ", o.count, " x world size ", size)));
        out->in_place = o.count > 0 && byte(o.data) == byte(in.data) + a.root * o.count * es;
        if (!out->in_place && overlaps(in.data, in.bytes(), o.data, o.bytes())) {
          return invalid("output overlaps input but is not the root's slice (the in-place form)");
        }
      }
      return {};
    }
    case OpType::kBarrier:
      out->count = 0;
      return {};
    case OpType::kSend:
    case OpType::kRecv:
      COMMS_RETURN_IF_ERROR(check_rank(a.peer, size, "peer"));
      if (a.peer == rank) return invalid(str::cat("peer ", a.peer, " is this rank itself"));
      COMMS_RETURN_IF_ERROR(check_present(in, "buffer"));
      return {};
    case OpType::kBatchP2P: {
      if (a.p2p.empty()) {
        out->count = 0;
        return {};
      }
      const BufferView& first = a.p2p.front().buffer;
      out->dtype = first.dtype;
      out->device_type = first.device.type;
      out->count = 0;
      for (size_t i = 0; i < a.p2p.size(); ++i) {
        const auto& op = a.p2p[i];
        const auto what = str::cat("ops[", i, "] (",
                                       op.kind == P2POp::Kind::kSend ? "send" : "recv", ")");
        COMMS_RETURN_IF_ERROR(check_rank(op.peer, size, str::cat(what, " peer")));
        if (op.peer == rank) return invalid(str::cat(what, " peer ", op.peer, " is this rank itself"));
        COMMS_RETURN_IF_ERROR(check_present(op.buffer, what));
        if (op.buffer.device.type != first.device.type) {
          return invalid(str::cat(what, " is on ", op.buffer.device.to_string(), " but ops[0] is on ",
                                      first.device.to_string(), "; a batch runs on one device type"));
        }
      }
      return {};
    }
  }
  return invalid(str::cat("unknown op type ", static_cast<int>(a.type), " for ", describe(in)));
}

}  // namespace comms::internal
