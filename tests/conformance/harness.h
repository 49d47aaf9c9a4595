// The pieces of comms-conformance that every case uses: typed buffers,
// closed-form values and expectations, the per-case checker, and the case
// registry. Cases live in op_cases.cc and error_cases.cc, the driver in
// main.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comms/comms.h"
#include "device_memory.h"
#include "op_oracle.h"

namespace comms::conformance {

struct SuiteOptions {
  std::string backend;
  Device device = Device::cpu();
  std::string plugin;
  // Cases run when their name matches a --filter glob (any; none given: all)
  // and no --exclude glob. A case matching a --require glob must pass: a
  // skip (say, an op the backend does not claim) fails it, and so does a
  // --require glob that matches no case.
  std::vector<std::string> filters;
  std::vector<std::string> excludes;
  std::vector<std::string> required;
  bool quick = false;
  std::string json_path;
  std::chrono::milliseconds op_timeout{60000};
  std::chrono::milliseconds case_timeout{120000};
  bool stand_in_device = false;  // --device cuda on host memory (the suite's own test)
  bool backend_memory = false;   // --backend-memory: cpu buffers from the comm's allocator
  // --expect-zero-copy: every case of an op the UCX zero-copy path runs
  // must raise the count its backend's describe() gives under "zero_copy".
  bool expect_zero_copy = false;
};

// A typed buffer on the suite's memory, staged on the host. On cpu the host
// bytes are the buffer. On cuda they are a staging copy: view() uploads them
// first if set() changed them, and get() reads the device back first if a
// view was handed out since (both on the memory's stream, so after the ops
// issued there). One spare byte keeps data() non-null even for zero
// elements, so a zero-count view is never mistaken for a null one.
class Buf {
 public:
  Buf() = default;
  // On the host (labelled cpu), whatever the suite's device.
  Buf(DataType t, size_t n);
  Buf(DeviceMemory& memory, DataType t, size_t n);
  Buf(Buf&&) noexcept = default;
  Buf& operator=(Buf&&) noexcept = default;
  DataType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  BufferView view() { return view(0, count_); }
  BufferView view(size_t offset, size_t n);
  // These throw comms::Error when a copy to or from the device fails.
  double get(size_t i) const;
  void set(size_t i, double v);
  // The host bytes, read back from the device first where needed. The
  // mutable form marks them for upload at the next view().
  const uint8_t* host_bytes() const;
  uint8_t* mutable_host_bytes();

 private:
  struct Release {
    DeviceMemory* memory;
    void operator()(void* p) const noexcept { memory->release(p); }
  };
  bool staged() const { return device_ != nullptr; }
  void read_back() const;

  DataType dtype_ = DataType::kFloat32;
  size_t count_ = 0;
  mutable std::vector<uint8_t> bytes_;
  DeviceMemory* memory_ = nullptr;  // null or cpu: bytes_ is the buffer
  std::unique_ptr<void, Release> device_{nullptr, Release{nullptr}};
  bool host_changed_ = false;           // set() since the last upload
  mutable bool device_changed_ = false;  // a view handed out since the last read-back
};

// Input values, expectations and tolerances: the oracle the mp op tests
// share (tests/support/op_oracle.h).
using oracle::all_data_types;
using oracle::data_value;
using oracle::expected_reduction;
using oracle::reduce_input;
using oracle::reductions_for;
using oracle::tolerance;

std::string reduce_name(const ReduceOp& op);  // "sum", "premul_sum"

// What one case is being checked for, named in every failure message.
struct Where {
  std::string op;
  DataType dtype = DataType::kFloat32;
  std::string redop;  // "" for ops without a reduction
  size_t count = 0;
  int root = -1;
  std::string mode;  // sync, async, inflight#k
  std::string what;  // which buffer, e.g. "output", "input left intact"
  std::string describe() const;
};

// Collects the first failure of a case on this rank. Checks never throw and
// never return early for the caller: every rank keeps issuing the same ops.
class Checker {
 public:
  Checker(int world_rank, int group_rank) : world_rank_(world_rank), group_rank_(group_rank) {}
  // Compares got[offset + i] with expect(i) for i < n: exactly for integers
  // and bool, within the dtype's tolerance for floating types.
  void values(const Buf& got, size_t offset, size_t n, const Where& where,
              const std::function<double(size_t)>& expect);
  void fail(const std::string& message);
  // Takes over another checker's first failure (e.g. from a helper thread).
  void merge(const Checker& other) {
    if (first_failure_.empty()) first_failure_ = other.first_failure_;
  }
  bool failed() const { return !first_failure_.empty(); }
  const std::string& first_failure() const { return first_failure_; }
  int world_rank() const { return world_rank_; }
  int group_rank() const { return group_rank_; }

 private:
  int world_rank_;
  int group_rank_;
  std::string first_failure_;
};

// The group a case runs on, from this rank's point of view.
struct Group {
  std::string shape;             // world, contiguous, reversed, ...
  std::shared_ptr<Comm> comm;    // null where this rank is not a member
  std::vector<int> group_sizes;  // sizes of every group of the shape (all ranks know them)
  int min_size() const;
};

struct CaseContext {
  Comm& comm;
  Checker& check;
  const SuiteOptions& options;
  Comm& world;
  DeviceMemory& memory;  // where the case's buffers live; its stream runs the ops
};

// Options of one op of the suite: on the memory's stream (CUDA ops are
// ordered on it; the suite reads results back on the same stream).
OpOptions op_options(const DeviceMemory& memory, bool async = false);

struct Case {
  std::string name;  // "<shape>/<op>/<dtype>/<redop>/<placement>"
  std::string group;  // the summary row
  // Non-empty: the case is skipped on every rank, with this reason.
  std::string skip_reason;
  std::function<void(CaseContext&)> body;
};

bool matches_any(const std::vector<std::string>& globs, const std::string& name);
// --filter and --exclude.
bool selected(const SuiteOptions& options, const std::string& case_name);

// What the plugin under test claims (PluginDescriptor::capabilities); a
// plugin that declares nothing claims everything.
struct Claims {
  std::string plugin;
  bool declared = false;
  std::vector<std::string> ops;
  std::vector<DataType> dtypes;
  std::vector<ReduceKind> reductions;

  static Claims of(const PluginInfo& info);
  bool claims_op(const std::string& op) const;
  bool claims(DataType t) const;
  bool claims(ReduceKind k) const;
  // Why an op case ("<shape>/<op>/<dtype>/...") cannot run: its op (send_recv
  // needs send and recv) or its data type is not claimed. "" if it can.
  std::string unclaimed(const std::string& case_name) const;
  std::string not_claimed(const std::string& what) const;
};

// Whether the backend reduces (dtype, kind): from its claims when it
// declares them, else probed once over the world (an all_reduce of each pair).
class Capabilities {
 public:
  void probe(Comm& world, DeviceMemory& memory);
  void from_claims(const Claims& claims);
  bool supports(DataType t, ReduceKind k) const { return supported_[int(t)][int(k)]; }
  std::string unsupported_reason(DataType t, const ReduceOp& op) const;

 private:
  bool supported_[kNumDataTypes][kNumReduceKinds] = {};
};

// Appends the op cases of one group shape.
void add_op_cases(const Group& group, const Capabilities& caps, const SuiteOptions& options,
                  std::vector<Case>* cases);
// Error-path and lifecycle cases; they run on the world comm.
void add_error_cases(const std::string& shape, const Group& group, std::vector<Case>* cases);
void add_lifecycle_cases(int world_size, const SuiteOptions& options, std::vector<Case>* cases);
// One-sided window cases on the world comm (window_cases.cc); with
// has_windows false, only the one that expects unsupported runs. backend:
// the device's plugin, e.g. "cpu:gloo".
void add_window_cases(bool has_windows, const std::string& backend, const SuiteOptions& options,
                      std::vector<Case>* cases);

}  // namespace comms::conformance
