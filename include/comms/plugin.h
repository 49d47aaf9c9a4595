// The backend plugin ABI. A backend is a shared module named
// libcomms-<name>.so that exports one C symbol, comms_plugin_entry, returning
// a PluginDescriptor. Everything a plugin needs is in this header and the
// headers it includes; a plugin does not link libcomms (build it with
// `pkg-config --cflags comms-plugin` and -Wl,--no-undefined). docs/PLUGINS.md
// is the author's guide.
//
// Versioning (NCCL-style, see PluginDescriptor):
// - The descriptor starts with abi_version and struct_size; those two never
//   move. abi_version is (major << 16) | minor.
// - Major: any change that moves or retypes something a plugin already uses
//   (a field, a virtual method, an enum value, a type below or in the headers
//   this one includes). libcomms refuses every other major, naming both.
// - Minor: additions only, at the end: a descriptor entry, a field of
//   OpDesc/BackendInit/SplitDesc/GrowDesc (libcomms creates those and passes
//   them by reference; an older plugin reads the prefix it knows), or a
//   virtual method of Backend/Work with a default body. libcomms accepts plugins of
//   its major with a minor up to its own; a newer minor is refused, naming
//   both (the plugin may rely on fields this libcomms does not fill).
// - Descriptor entries: libcomms reads an entry only when the plugin's
//   struct_size covers it; entries past it count as absent (null). Entries
//   before kMinDescriptorSize are required.
// - A virtual method added to Backend in minor N is called only on backends
//   whose plugin declared a minor >= N (an older plugin's vtable has no such
//   slot); libcomms falls back to the behaviour of the default body.
// Plugins are never unloaded.
//
// Toolchain contract: the ABI is C++. The descriptor is plain C data, but the
// Backend interface passes std::string, std::map (Hints), std::span,
// std::shared_ptr<Store>, std::unique_ptr and vtables, and Status carries a
// std::string. So a plugin must be built with
// - libstdc++ with the C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=1, the
//   default since GCC 5); libc++ (clang -stdlib=libc++) does not work;
// - g++ of the same major as libcomms is what the project tests (g++ 12). A
//   newer g++ works when its libstdc++.so is the one the process loads
//   (libstdc++ keeps these types' layouts stable across majors); clang with
//   libstdc++ works the same way;
// - -std=c++20 (std::span) and default packing and alignment.
// Memory crosses the boundary only through these types, whose destructors
// run in the code that compiled them inline: each side frees what it owns
// (a Backend or Work is destroyed through its virtual destructor).
//
// Errors: plugin functions return comms::Status and never throw across this
// boundary (libcomms also catches, and reports a throw as kInternal).
//
// Division of work: libcomms validates every argument (counts, dtypes, roots,
// peers, devices, aliasing) before a backend sees an op, numbers ops, routes
// hints, and names comms, ops and ranks in error messages. A backend moves
// the data, enforces timeouts, and reports failures.
//
// Minimal plugin (build with hidden visibility; the export macro keeps the
// entry visible, without it libcomms cannot find the symbol):
//   static comms::Status create(const comms::plugin::BackendInit&,
//                               std::unique_ptr<comms::plugin::Backend>*);
//   static const char* const kHintKeys[] = {nullptr};
//   static const comms::plugin::Capabilities kClaims = {   // optional
//       .ops = comms::plugin::op_bit(comms::plugin::OpType::kAllReduce) |
//              comms::plugin::op_bit(comms::plugin::OpType::kBarrier)};
//   extern "C" COMMS_PLUGIN_EXPORT const comms::plugin::PluginDescriptor* comms_plugin_entry() {
//     static const comms::plugin::PluginDescriptor d = {
//         .name = "mybackend",
//         .version = "1.0",
//         .device_types = comms::plugin::device_bit(comms::DeviceType::kCpu),
//         .hint_keys = kHintKeys,
//         .create = create,
//         .capabilities = &kClaims,
//     };  // abi_version and struct_size default to this header's
//     return &d;
//   }
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "comms/error.h"
#include "comms/options.h"
#include "comms/store.h"
#include "comms/types.h"

// 2.0: the first growable ABI (1 had no struct_size and no minor).
// 2.1: PluginDescriptor::capabilities.
// 2.2: registered buffers (Backend::register_buffer/deregister_buffer,
//      PluginDescriptor::features, mem_alloc, mem_free).
// 2.3: Backend::shrink (elastic recovery; see the block marked ABI 2.3 below).
// 2.4: Backend::revoke (elastic recovery; see the block marked ABI 2.4 below).
// 2.5: PluginDescriptor::env_variables.
// 2.6: one-sided windows (Backend::register_window, deregister_window,
//      submit_window) and offload by suspend (Backend::suspend, resume).
// 2.7: elastic growth (GrowDesc, Backend::grow, PluginDescriptor::join_grown;
//      see the blocks marked ABI 2.7 below).
#define COMMS_PLUGIN_ABI_MAJOR 2u
#define COMMS_PLUGIN_ABI_MINOR 7u
#define COMMS_PLUGIN_ABI_VERSION ((COMMS_PLUGIN_ABI_MAJOR << 16) | COMMS_PLUGIN_ABI_MINOR)
#define COMMS_PLUGIN_ENTRY_SYMBOL "comms_plugin_entry"
// Put on comms_plugin_entry: plugins are built with hidden visibility.
#define COMMS_PLUGIN_EXPORT __attribute__((visibility("default")))

namespace comms::plugin {

constexpr uint32_t device_bit(DeviceType t) { return 1u << static_cast<unsigned>(t); }

enum class OpType : uint8_t {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,      // output: size * count contiguous elements
  kAllGatherList,  // output_list: size buffers of count elements
  kAllGatherV,     // counts[r]: elements from rank r; output: sum(counts)
  kReduceScatter,  // input: size * count; output: count
  kReduceScatterV, // counts[r]: elements rank r receives; input: sum(counts)
  kAllToAll,       // input and output: size * count; count per peer
  kAllToAllV,      // counts / output_counts: elements sent to / received from r
  kGather,         // output (root only): size * count
  kScatter,        // input (root only): size * count
  kBarrier,
  kSend,
  kRecv,
  kBatchP2P,
};
inline constexpr int kNumOpTypes = 16;
std::string_view op_name(OpType t);

// One operation, validated by libcomms. Spans and pointers are valid only
// during Backend::submit; an asynchronous backend copies what it keeps.
struct OpDesc {
  OpType type = OpType::kBarrier;
  uint64_t seq = 0;  // 1-based sequence number of the op on its comm
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;  // see OpType for what it counts
  DataType dtype = DataType::kFloat32;
  Device device;
  ReduceOp reduce;
  int root = -1;
  int peer = -1;
  uint32_t tag = 0;
  // True when input aliases output in the op's in-place convention:
  // all_reduce/reduce/all_to_all: input == output; all_gather: input ==
  // output + rank * count; reduce_scatter: output == input + rank * count;
  // gather (root): input == output + root * count; scatter (root): output ==
  // input + root * count.
  bool in_place = false;
  bool async = false;
  std::span<const size_t> counts;
  std::span<const size_t> output_counts;
  std::span<void* const> output_list;
  std::span<const P2POp> p2p;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;      // caller's cudaStream_t, or null
  const Hints* hints = nullptr;  // per-op hints for this backend, prefix removed
};

// The result of an asynchronous op. It must stay valid, and report the op's
// final status, after its backend was finalized or destroyed.
class Work {
 public:
  virtual ~Work() = default;
  // Non-blocking: whether the op finished (successfully or not).
  virtual bool is_completed() = 0;
  // kStream: CUDA backends make the op's stream the caller's dependency and
  // return; CPU backends block. kBlocking: block until the op finished.
  // Returns the op's status; repeated calls return the same status.
  virtual Status wait(WaitMode mode) = 0;
};

// ---- ABI 2.6: one-sided windows ----
// A window is memory every rank of a comm registered together
// (Backend::register_window); ranks then write into each other's windows
// without the target taking part, and count each other's signals.
enum class WindowOpType : uint8_t {
  // Copies `bytes` from `input` into `peer`'s window at byte `offset`. With
  // `signal`, the peer's signal count from this rank goes up by one once
  // the data is visible there. Puts from one rank to one peer land in issue
  // order. The op is complete when `input` may be reused.
  kPut,
  // Adds one to `peer`'s signal count from this rank, after every put this
  // rank issued to `peer` before it is visible there.
  kSignal,
  // Waits until, for every rank r, `signal_counts[r]` more signals from r
  // arrived than earlier waits consumed, and consumes them.
  kWaitSignal,
  // Returns once every put this rank issued on the window is visible at its
  // target.
  kFlush,
};

// One window op, validated by libcomms (offset and bytes inside the peer's
// window, peer in range, counts of comm size). Valid only during
// Backend::submit_window, like OpDesc.
struct WindowOpDesc {
  WindowOpType type = WindowOpType::kFlush;
  uint64_t seq = 0;          // numbered with the comm's other ops
  void* window = nullptr;    // the handle register_window returned
  const void* input = nullptr;
  size_t bytes = 0;
  int peer = -1;
  size_t offset = 0;         // bytes into the peer's window
  bool signal = false;
  std::span<const uint64_t> signal_counts;  // kWaitSignal: one per rank
  bool async = false;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;    // caller's cudaStream_t, or null
};
std::string_view window_op_name(WindowOpType t);
// ---- end of ABI 2.6 ----

struct BackendInit {
  std::string comm_name;   // the comm's name, for messages
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  // Ranks of the job on this host; CPU backends decide busy-polling from it.
  int local_size = 1;
  Device device;           // the device this backend serves; index resolved
  bool eager = false;      // init() runs inside new_comm (device was given)
  // Namespaced for this comm incarnation and backend; keys never collide with
  // other comms. Lives at least as long as the backend.
  std::shared_ptr<Store> store;
  std::chrono::milliseconds init_timeout{0};
  std::chrono::milliseconds op_timeout{0};
  Hints hints;             // this backend's hints, prefix removed, validated
  bool abort_process_on_error = false;
  // The local address this process uses to reach the rendezvous store ("" if
  // unknown, e.g. a file store). Network backends bind it by default: it is
  // routable to the other hosts of the job.
  std::string store_local_address;
  // Optional logging sink of the host (level: 0 debug, 1 info, 2 warning, 3 error).
  void (*log)(int level, const char* message) = nullptr;
};

struct SplitDesc {
  // Parent ranks of the new group in child-rank order; empty on parent ranks
  // that are not members (they still call split: NCCL's split is collective
  // over the parent).
  std::span<const int> ranks;
  // The child's init (rank, size, store, timeouts, merged hints). For
  // non-members only hints and timeouts are meaningful.
  BackendInit child;
};

// ---- ABI 2.7 (elastic growth) ---------------------------------------------
// A comm grows by newcomers (comms::admit on its members, comms::join on the
// newcomers): the members keep their ranks [0, members), the newcomers take
// [members, child.size), as NCCL's ncclCommGrow numbers them.
struct GrowDesc {
  int members = 0;   // the parent comm's size
  // The grown backend's init: this participant's rank, the grown size, a
  // fresh store namespace shared by every participant, the parent's hints
  // and timeouts (a newcomer learnt them from the members).
  BackendInit child;
};
// ---- end of ABI 2.7 ---------------------------------------------------------

class Backend {
 public:
  virtual ~Backend() = default;

  // Connects to the peers. Collective over the comm. Called once, inside
  // new_comm when eager, else before the first op on this backend.
  virtual Status init() = 0;

  // Runs or enqueues an op. Synchronous ops (op.async false) may run on the
  // calling thread and leave *work null; asynchronous ops set *work. Ops are
  // submitted in order from one thread at a time, and must complete in
  // submission order with respect to each other.
  virtual Status submit(const OpDesc& op, std::unique_ptr<Work>* work) = 0;

  // Creates the child backend for a split. Collective over the parent.
  // Non-members return ok with a null child.
  virtual Status split(const SplitDesc& desc, std::unique_ptr<Backend>* child) = 0;

  // Applies hints at run time, or rejects them with a reason. Keys are this
  // backend's, prefix removed.
  virtual Status set_hints(const Hints& hints) = 0;

  // Changes the op timeout for ops submitted from now on.
  virtual Status set_op_timeout(std::chrono::milliseconds timeout) = 0;

  // Fails every in-flight and future op with kAborted, promptly, and wakes
  // every thread blocked in the backend. Peers see this rank as failed.
  virtual void abort(const std::string& reason) = 0;

  // Waits for outstanding ops (bounded by their timeouts), then releases
  // connections, memory and threads. Returns any failure to release. After
  // finalize only device_memory_used() and the destructor may be called.
  virtual Status finalize() = 0;

  // The effective configuration as a JSON object, e.g. {"transport":"tcp",...}.
  virtual std::string describe() const = 0;

  // Whether the backend can reduce this type with this operator (on this
  // device). Rejections are reported as kUnsupported before anything is sent.
  // The answer must not change over the backend's life: libcomms asks once
  // per dtype and kind and keeps it.
  virtual bool supports_reduction(DataType dtype, ReduceKind kind) const = 0;

  // Bytes of device memory in use on this backend's device (the whole
  // device, as cudaMemGetInfo reports it), or -1 where that cannot be
  // measured (CPU). Offload reports it before and after: the "after" is
  // asked between finalize() and the destructor, so it must not need what
  // finalize released.
  virtual int64_t device_memory_used() const { return -1; }

  // ---- ABI 2.2: registered buffers ----
  // Called only on plugins of minor >= 2 whose descriptor claims
  // kFeatureRegisterBuffers. Registers [data, data + bytes) with the
  // backend's library for this comm (NCCL: ncclCommRegister) and returns its
  // handle. The backend releases handles still registered at finalize() and
  // in its destructor; libcomms deregisters them first.
  virtual Status register_buffer(void* /*data*/, size_t /*bytes*/, void** /*handle*/) {
    return {ErrorCode::kUnsupported, "this backend cannot register buffers"};
  }
  virtual Status deregister_buffer(void* /*handle*/) {
    return {ErrorCode::kUnsupported, "this backend cannot register buffers"};
  }
  // ---- end of ABI 2.2 ----

  // ---- ABI 2.3 (elastic recovery) -------------------------------------------
  // Builds the backend of the survivors of this (revoked, aborted) backend:
  // `desc.ranks` are the surviving parent ranks in child-rank order, the same
  // on every survivor; the excluded ranks do not take part (they may be dead).
  // `desc.child` is the new backend's init, under a fresh store namespace.
  // Collective over the survivors. kUnsupported (the default) makes libcomms
  // re-create the backend through PluginDescriptor::create with desc.child,
  // which every backend supports; a native shrink (NCCL's ncclCommShrink) is
  // only faster. Called only on plugins of ABI >= 2.3.
  virtual Status shrink(const SplitDesc& desc, std::unique_ptr<Backend>* child) {
    (void)desc;
    (void)child;
    return Status(ErrorCode::kUnsupported, "no native shrink");
  }
  // ---- end of ABI 2.3 ---------------------------------------------------------

  // ---- ABI 2.4 (elastic recovery) -------------------------------------------
  // Like abort() (every in-flight and future op fails, promptly; every
  // blocked thread wakes), but for a comm being revoked: ops fail with
  // kRevoked, and the backend may keep what a later shrink() of this backend
  // needs (NCCL: ncclCommRevoke instead of ncclCommAbort). The default is
  // abort(). Called only on plugins of ABI >= 2.4 (older ones get abort()).
  virtual void revoke(const std::string& reason) { abort(reason); }
  // ---- end of ABI 2.4 ---------------------------------------------------------

  // ---- ABI 2.6: one-sided windows --------------------------------------------
  // Called only on plugins of minor >= 6 whose descriptor claims
  // kFeatureWindows. register_window is collective over the comm: every rank
  // passes its own [data, data + bytes) (sizes may differ; libcomms has
  // exchanged them and checks offsets against them) and gets a handle.
  // deregister_window is collective too. The backend releases windows still
  // registered at finalize(), abort() and in its destructor.
  virtual Status register_window(void* /*data*/, size_t /*bytes*/, void** /*window*/) {
    return {ErrorCode::kUnsupported, "this backend has no windows"};
  }
  virtual Status deregister_window(void* /*window*/) {
    return {ErrorCode::kUnsupported, "this backend has no windows"};
  }
  // Runs or enqueues a window op, with the same rules as submit() (order,
  // *work for async ops, timeouts, a dead peer -> kPeerFailure).
  virtual Status submit_window(const WindowOpDesc& /*op*/, std::unique_ptr<Work>* /*work*/) {
    return {ErrorCode::kUnsupported, "this backend has no windows"};
  }

  // Offload that keeps the communicator (NCCL >= 2.29: ncclCommSuspend):
  // releases the backend's device memory; resume() restores it without a
  // rendezvous. Collective, like finalize and re-creation. kUnsupported (the
  // default) makes libcomms offload by finalize() and reload by re-creating
  // the backend. Called only on plugins of minor >= 6.
  virtual Status suspend() { return {ErrorCode::kUnsupported, "no suspend"}; }
  virtual Status resume() { return {ErrorCode::kUnsupported, "no suspend"}; }
  // ---- end of ABI 2.6 ---------------------------------------------------------

  // ---- ABI 2.7 (elastic growth) ---------------------------------------------
  // A member's side of a native grow (NCCL's ncclCommGrow): builds the grown
  // backend from this one, while each newcomer builds its own through
  // PluginDescriptor::join_grown with its GrowDesc. Collective over every
  // participant of the grown comm. libcomms calls grow/join_grown either on
  // every participant or on none (they agree through the store first: each
  // needs a plugin of ABI >= 2.7 with join_grown, and each member a live
  // backend). A plugin that cannot grow natively after all (say, the NCCL
  // loaded somewhere lacks ncclCommGrow) answers kUnsupported on every
  // participant, having built nothing (it agrees through desc.child.store);
  // libcomms then re-creates the backend through create() with desc.child
  // everywhere, which every plugin supports. kUnsupported is the default,
  // and leaves this backend as it was; another failure fails the admission
  // everywhere and may leave this backend failed (NCCL aborts a parent whose
  // grow failed part-way). Called only on plugins of ABI >= 2.7.
  virtual Status grow(const GrowDesc& desc, std::unique_ptr<Backend>* child) {
    (void)desc;
    (void)child;
    return Status(ErrorCode::kUnsupported, "no native grow");
  }
  // ---- end of ABI 2.7 ---------------------------------------------------------
};

constexpr uint32_t op_bit(OpType t) { return 1u << static_cast<unsigned>(t); }
constexpr uint32_t dtype_bit(DataType t) { return 1u << static_cast<unsigned>(t); }
constexpr uint32_t reduce_bit(ReduceKind k) { return 1u << static_cast<unsigned>(k); }
inline constexpr uint32_t kAllOps = (1u << kNumOpTypes) - 1;
inline constexpr uint32_t kAllDataTypes = (1u << kNumDataTypes) - 1;
inline constexpr uint32_t kAllReductions = (1u << kNumReduceKinds) - 1;

// What a backend claims to implement (PluginDescriptor::capabilities). The
// conformance suite reports a case needing an op, data type or reduction
// outside these as skipped, naming what is not claimed, instead of failing
// it; comms-info lists the claims. libcomms does not filter ops by them: an
// unclaimed op still reaches submit(), which should return kUnsupported.
// Send and recv are claimed separately; a suite case of both needs both.
struct Capabilities {
  uint32_t ops = kAllOps;                // op_bit(OpType) of each op
  uint32_t dtypes = kAllDataTypes;       // dtype_bit(DataType) of each data type
  uint32_t reductions = kAllReductions;  // reduce_bit(ReduceKind) of each reduction
};

// An environment variable a plugin reads (PluginDescriptor::env_variables):
// comms-info shows it beside libcomms' own, and docs/ENVIRONMENT.md lists it.
struct EnvVariable {
  const char* name;
  const char* default_value;  // as text; "" when unset means "not used"
  const char* description;
};

// Plain C data, read by libcomms through the prefix the plugin's struct_size
// covers. New entries are only ever appended (with a minor bump).
struct PluginDescriptor {
  // These two never move. Left out of a designated initializer, they take
  // this header's values.
  uint32_t abi_version = COMMS_PLUGIN_ABI_VERSION;
  uint32_t struct_size = sizeof(PluginDescriptor);

  // Required (ABI 2.0).
  const char* name = nullptr;     // lower case, e.g. "gloo"
  const char* version = nullptr;  // of the plugin and the library it wraps
  uint32_t device_types = 0;      // bitmask of device_bit(DeviceType)
  // Hint keys the backend accepts (without prefix); null-terminated.
  const char* const* hint_keys = nullptr;
  Status (*create)(const BackendInit& init, std::unique_ptr<Backend>* out) = nullptr;

  // Optional (ABI 2.0): null, or past the plugin's struct_size, means absent.
  // Devices of `type` usable now (0 if none). Absent: 1 for every supported type.
  int (*device_count)(DeviceType type) = nullptr;
  // Dry run: the effective configuration the hints would give, as a JSON
  // object, without creating a backend or touching a device. Rejects
  // invalid hints with the reason.
  Status (*explain_hints)(const Hints& hints, std::string* json) = nullptr;

  // Optional (ABI 2.1): what the backend claims to implement; absent (null,
  // or a plugin of ABI 2.0) claims everything.
  const Capabilities* capabilities = nullptr;

  // ---- ABI 2.2: registered buffers ----
  // kFeature* bits; absent (0): none.
  uint32_t features = 0;
  // Device memory the backend's library prefers for registered buffers
  // (NCCL: ncclMemAlloc), and its release. Need no backend instance.
  Status (*mem_alloc)(Device device, size_t bytes, void** ptr) = nullptr;
  Status (*mem_free)(Device device, void* ptr) = nullptr;
  // ---- end of ABI 2.2 ----

  // ---- ABI 2.5: environment variables ----
  // Every variable the plugin reads, ended by an entry whose name is null;
  // absent (null): none. Read through comms/env.h.
  const EnvVariable* env_variables = nullptr;
  // ---- end of ABI 2.5 ----

  // ---- ABI 2.7 (elastic growth) ----
  // A newcomer's side of Backend::grow (it has no backend to grow from):
  // builds its backend of the grown comm, desc.child.rank >= desc.members.
  // The same contract as grow(): all participants native, or kUnsupported
  // on every one of them (libcomms then calls create() with desc.child).
  // Absent (null): this plugin never grows natively; a plugin that sets it
  // overrides Backend::grow.
  Status (*join_grown)(const GrowDesc& desc, std::unique_ptr<Backend>* out) = nullptr;
  // ---- end of ABI 2.7 ----

  // Append new entries here.
};

// ABI 2.2 PluginDescriptor::features bits.
inline constexpr uint32_t kFeatureRegisterBuffers = 1u << 0;  // Backend::register_buffer works
inline constexpr uint32_t kFeatureMemAlloc = 1u << 1;         // mem_alloc/mem_free are set
// ABI 2.6: Backend::register_window and submit_window work.
inline constexpr uint32_t kFeatureWindows = 1u << 2;

// The smallest struct_size libcomms accepts: through the required entries.
inline constexpr uint32_t kMinDescriptorSize =
    offsetof(PluginDescriptor, create) + sizeof(PluginDescriptor::create);

static_assert(std::is_standard_layout_v<PluginDescriptor> &&
              std::is_trivially_copyable_v<PluginDescriptor>,
              "the descriptor is C data: libcomms copies the prefix a plugin declares");

inline constexpr uint32_t abi_major(uint32_t abi_version) { return abi_version >> 16; }
inline constexpr uint32_t abi_minor(uint32_t abi_version) { return abi_version & 0xffffu; }

}  // namespace comms::plugin

extern "C" {
typedef const comms::plugin::PluginDescriptor* (*comms_plugin_entry_fn)();
}

inline std::string_view comms::plugin::op_name(OpType t) {
  switch (t) {
    case OpType::kAllReduce: return "all_reduce";
    case OpType::kReduce: return "reduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllGather: return "all_gather";
    case OpType::kAllGatherList: return "all_gather_list";
    case OpType::kAllGatherV: return "all_gather_v";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kReduceScatterV: return "reduce_scatter_v";
    case OpType::kAllToAll: return "all_to_all";
    case OpType::kAllToAllV: return "all_to_all_v";
    case OpType::kGather: return "gather";
    case OpType::kScatter: return "scatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kBatchP2P: return "batch_p2p";
  }
  return "unknown";
}

inline std::string_view comms::plugin::window_op_name(WindowOpType t) {
  switch (t) {
    case WindowOpType::kPut: return "put";
    case WindowOpType::kSignal: return "signal";
    case WindowOpType::kWaitSignal: return "wait_signal";
    case WindowOpType::kFlush: return "flush";
  }
  return "window op";
}
