#include "harness.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "comms/numeric.h"

namespace comms::conformance {

Buf::Buf(DataType t, size_t n) : dtype_(t), count_(n), bytes_(n * element_size(t) + 1) {}

Buf::Buf(DeviceMemory& memory, DataType t, size_t n) : Buf(t, n) {
  if (memory.device().type == DeviceType::kCpu) return;
  memory_ = &memory;
  device_ = {memory.allocate(bytes_.size()), Release{&memory}};
  host_changed_ = true;  // the device starts from the host bytes (zeros), not garbage
}

BufferView Buf::view(size_t offset, size_t n) {
  const size_t at = offset * element_size(dtype_);
  if (!staged()) return {bytes_.data() + at, n, dtype_, Device::cpu()};
  if (host_changed_) {
    memory_->upload(device_.get(), bytes_.data(), bytes_.size());
    host_changed_ = false;
  }
  // Whoever holds the view may write through it.
  device_changed_ = true;
  return {static_cast<uint8_t*>(device_.get()) + at, n, dtype_, memory_->device()};
}

void Buf::read_back() const {
  if (!staged() || !device_changed_) return;
  memory_->download(bytes_.data(), device_.get(), bytes_.size());
  device_changed_ = false;
}

const uint8_t* Buf::host_bytes() const {
  read_back();
  return bytes_.data();
}

uint8_t* Buf::mutable_host_bytes() {
  read_back();
  if (staged()) host_changed_ = true;
  return bytes_.data();
}

double Buf::get(size_t i) const { return numeric::load_as_double(host_bytes(), dtype_, i); }

void Buf::set(size_t i, double v) {
  // The other elements keep what the device holds.
  uint8_t* p = mutable_host_bytes();
  // store_from_double converts through the integer type directly; values
  // outside its range would be undefined, so integers go through int64.
  switch (dtype_) {
    case DataType::kInt8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DataType::kUint8: p[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DataType::kInt32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DataType::kUint32: reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v)); break;
    default: numeric::store_from_double(p, dtype_, i, v);
  }
}

std::vector<DataType> all_data_types() {
  std::vector<DataType> types;
  for (int i = 0; i < kNumDataTypes; ++i) types.push_back(static_cast<DataType>(i));
  return types;
}

std::vector<ReduceOp> reductions_for(DataType t) {
  std::vector<ReduceOp> ops;
  for (int k = 0; k < kNumReduceKinds; ++k) {
    const auto kind = static_cast<ReduceKind>(k);
    if (!reduction_defined(t, kind)) continue;
    ops.push_back(kind == ReduceKind::kPremulSum ? ReduceOp::premul_sum(2.0) : ReduceOp(kind));
  }
  return ops;
}

std::string reduce_name(const ReduceOp& op) { return std::string(to_string(op.kind)); }

namespace {

bool is_fp8(DataType t) { return t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2; }

// Wraps an exact integer result to the type, as two's complement hardware does.
double wrap(DataType t, int64_t v) {
  switch (t) {
    case DataType::kInt8: return static_cast<int8_t>(v);
    case DataType::kUint8: return static_cast<uint8_t>(v);
    case DataType::kInt32: return static_cast<int32_t>(v);
    case DataType::kUint32: return static_cast<uint32_t>(v);
    case DataType::kInt64: return static_cast<double>(v);
    case DataType::kUint64: return static_cast<double>(static_cast<uint64_t>(v));
    default: return static_cast<double>(v);
  }
}

}  // namespace

double reduce_input(DataType t, ReduceKind kind, int r, size_t i) {
  if (t == DataType::kBool) return (r + i) % 3 != 0;
  switch (kind) {
    case ReduceKind::kProduct: return 1 + (r + i) % 2;  // products are powers of two
    case ReduceKind::kBand:
    case ReduceKind::kBor:
    case ReduceKind::kBxor: return 1 + (r * 37 + i * 11) % 101;
    default: break;
  }
  // fp8 has 2-3 mantissa bits: with 0/1 inputs every partial sum (at most 8,
  // or 16 after premul_sum's factor 2) is exact.
  if (is_fp8(t)) return (r + i) % 2;
  return (r + 1) + (i % 3);
}

double expected_reduction(DataType t, const ReduceOp& op, int size, size_t i) {
  if (t == DataType::kBool) {
    bool any = false, all = true, parity = false;
    for (int r = 0; r < size; ++r) {
      const bool b = reduce_input(t, op.kind, r, i) != 0;
      any |= b;
      all &= b;
      parity ^= b;
    }
    switch (op.kind) {
      case ReduceKind::kSum: case ReduceKind::kMax: case ReduceKind::kBor: return any;
      case ReduceKind::kBxor: return parity;
      default: return all;
    }
  }
  int64_t sum = 0, prod = 1, band = -1, bor = 0, bxor = 0;
  double mn = INFINITY, mx = -INFINITY;
  for (int r = 0; r < size; ++r) {
    const double v = reduce_input(t, op.kind, r, i);
    const auto iv = static_cast<int64_t>(v);
    sum += iv;
    prod *= iv;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    band &= iv;
    bor |= iv;
    bxor ^= iv;
  }
  const bool integral = is_integral(t);
  switch (op.kind) {
    case ReduceKind::kSum: return wrap(t, sum);
    case ReduceKind::kProduct: return wrap(t, prod);
    case ReduceKind::kMin: return mn;
    case ReduceKind::kMax: return mx;
    case ReduceKind::kAvg:
      return integral ? std::trunc(wrap(t, sum) / size) : static_cast<double>(sum) / size;
    case ReduceKind::kPremulSum:
      return integral ? wrap(t, sum * static_cast<int64_t>(op.scalar)) : sum * op.scalar;
    case ReduceKind::kBand: return wrap(t, band);
    case ReduceKind::kBor: return wrap(t, bor);
    case ReduceKind::kBxor: return wrap(t, bxor);
  }
  return 0;
}

double data_value(DataType t, int r, size_t i) {
  const size_t key = static_cast<size_t>(r) * 1000003u + i;
  switch (t) {
    case DataType::kBool: return (r + i) % 2;
    case DataType::kFloat8E5M2: return (r * 3 + i) % 8;
    case DataType::kFloat8E4M3: return (r * 5 + i) % 16;
    case DataType::kBfloat16: return (r * 37 + i) % 256;
    case DataType::kInt8: return (r * 37 + i) % 127;
    case DataType::kUint8: return (r * 37 + i) % 251;
    case DataType::kFloat16: return key % 2048;
    default: return static_cast<double>(key % 16000000);  // exact in float32
  }
}

double tolerance(DataType t) {
  switch (t) {
    case DataType::kFloat16: return 1e-3;
    case DataType::kBfloat16: return 8e-3;
    case DataType::kFloat8E4M3: return 0.07;
    case DataType::kFloat8E5M2: return 0.13;
    case DataType::kFloat32: return 1e-6;
    case DataType::kFloat64: return 1e-12;
    default: return 0;
  }
}

OpOptions op_options(const DeviceMemory& memory, bool async) {
  OpOptions o;
  o.async = async;
  o.stream = memory.stream();
  return o;
}

std::string Where::describe() const {
  std::ostringstream s;
  s << "op " << op << " dtype " << to_string(dtype);
  if (!redop.empty()) s << " redop " << redop;
  s << " count " << count;
  if (root >= 0) s << " root " << root;
  if (!mode.empty()) s << " mode " << mode;
  if (!what.empty()) s << " (" << what << ")";
  return s.str();
}

void Checker::values(const Buf& got, size_t offset, size_t n, const Where& where,
                     const std::function<double(size_t)>& expect) {
  if (failed()) return;  // the first failure is the useful one
  try {
    got.host_bytes();
  } catch (const Error& e) {
    fail(where.describe() + ": reading the result back failed: " + e.what());
    return;
  }
  const double tol = tolerance(got.dtype());
  Buf rounded(got.dtype(), 1);
  for (size_t i = 0; i < n; ++i) {
    // Rounding the expectation to the type makes exact types compare exactly.
    rounded.set(0, expect(i));
    const double want = rounded.get(0);
    const double have = got.get(offset + i);
    const bool ok = tol == 0 ? have == want
                             : std::fabs(have - want) <= tol * std::max(1.0, std::fabs(want));
    if (!ok) {
      std::ostringstream s;
      s << where.describe() << ": first mismatch at index " << i << ": expected " << want
        << ", got " << have;
      fail(s.str());
      return;
    }
  }
}

void Checker::fail(const std::string& message) {
  if (!first_failure_.empty()) return;
  std::ostringstream s;
  s << "rank " << world_rank_ << " (group rank " << group_rank_ << "): " << message;
  first_failure_ = s.str();
}

int Group::min_size() const {
  return group_sizes.empty() ? 0 : *std::min_element(group_sizes.begin(), group_sizes.end());
}

void Capabilities::probe(Comm& world, DeviceMemory& memory) {
  // Every rank makes the same calls, so the table is the same everywhere. A
  // backend rejects an unsupported pair with kUnsupported before sending.
  for (DataType t : all_data_types()) {
    for (const ReduceOp& op : reductions_for(t)) {
      Buf b(memory, t, 1);
      b.set(0, 1);
      bool ok = true;
      try {
        world.all_reduce(b.view(), op, op_options(memory));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kUnsupported) throw;
        ok = false;
      }
      supported_[int(t)][int(op.kind)] = ok;
    }
  }
}

std::string Capabilities::unsupported_reason(DataType t, const ReduceOp& op) const {
  if (supports(t, op.kind)) return "";
  return "backend does not support " + reduce_name(op) + " on " + std::string(to_string(t));
}

}  // namespace comms::conformance
