#include "harness.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "comms/numeric.h"
#include "comms/plugin.h"

namespace comms::conformance {

Buf::Buf(DataType t, size_t n) : dtype_(t), count_(n), bytes_(n * element_size(t) + 1) {}

Buf::Buf(DeviceMemory& memory, DataType t, size_t n) : Buf(t, n) {
  if (!memory.staged()) return;
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
  oracle::store(p, dtype_, i, v);
}

std::string reduce_name(const ReduceOp& op) { return std::string(to_string(op.kind)); }

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
  for (size_t i = 0; i < n; ++i) {
    // Rounding the expectation to the type makes exact types compare exactly.
    const double want = oracle::round_to(got.dtype(), expect(i));
    const double have = got.get(offset + i);
    if (!oracle::matches(got.dtype(), want, have)) {
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

void Capabilities::from_claims(const Claims& claims) {
  for (DataType t : all_data_types()) {
    for (const ReduceOp& op : reductions_for(t)) {
      supported_[int(t)][int(op.kind)] = claims.claims(t) && claims.claims(op.kind);
    }
  }
}

bool matches_any(const std::vector<std::string>& globs, const std::string& name) {
  for (const auto& g : globs) {
    if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

bool selected(const SuiteOptions& options, const std::string& case_name) {
  return (options.filters.empty() || matches_any(options.filters, case_name)) &&
         !matches_any(options.excludes, case_name);
}

Claims Claims::of(const PluginInfo& info) {
  return {info.name, info.declares_capabilities, info.ops, info.dtypes, info.reductions};
}

bool Claims::claims_op(const std::string& op) const {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}
bool Claims::claims(DataType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }
bool Claims::claims(ReduceKind k) const {
  return std::find(reductions.begin(), reductions.end(), k) != reductions.end();
}

std::string Claims::not_claimed(const std::string& what) const {
  return "backend '" + plugin + "' does not claim " + what + " (PluginDescriptor::capabilities)";
}

std::string Claims::unclaimed(const std::string& case_name) const {
  if (!declared) return "";
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t slash = case_name.find('/', at);
    parts.push_back(case_name.substr(at, slash == std::string::npos ? std::string::npos : slash - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  if (parts.size() < 2) return "";
  const std::string& op = parts[1];
  if (op == "send_recv" || op == "send_from_an_idle_sender") {
    for (const char* o : {"send", "recv"}) {
      if (!claims_op(o)) return not_claimed(o);
    }
  } else {
    bool is_op = false;
    for (int t = 0; t < plugin::kNumOpTypes; ++t) is_op |= plugin::op_name(static_cast<plugin::OpType>(t)) == op;
    if (is_op && !claims_op(op)) return not_claimed(op);
  }
  if (parts.size() >= 3) {
    for (DataType t : all_data_types()) {
      if (parts[2] == to_string(t) && !claims(t)) return not_claimed(std::string("data type ") + parts[2]);
    }
  }
  return "";
}

std::string Capabilities::unsupported_reason(DataType t, const ReduceOp& op) const {
  if (supports(t, op.kind)) return "";
  return "backend does not support " + reduce_name(op) + " on " + std::string(to_string(t));
}

}  // namespace comms::conformance
