// comms-conformance: the multi-process suite every backend plugin must pass.
// Run under a launcher (commsrun, mpirun, srun); every rank runs the same
// cases in the same order, and rank 0 prints the combined result.
#include <fnmatch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "device_memory.h"
#include "comms/env.h"
#include "harness.h"

namespace comms::conformance {
namespace {

using namespace std::chrono_literals;

// --json -: the process's real stdout, which carries the JSON document alone
// (a pipe into jq must read nothing else); stdout itself then goes to stderr.
FILE* g_json_stdout = nullptr;

// One group shape: its groups as lists of world ranks. Two-level shapes are
// split from a reversed parent, with `groups` given in parent ranks.
struct Shape {
  std::string name;
  std::vector<std::vector<int>> groups;
  bool two_levels = false;
};

std::vector<int> iota_ranks(int from, int to) {
  std::vector<int> r;
  for (int i = from; i < to; ++i) r.push_back(i);
  return r;
}

std::vector<Shape> shapes_for(int n, std::vector<std::string>* impossible) {
  std::vector<Shape> shapes;
  shapes.push_back({"world", {iota_ranks(0, n)}});
  const int half = (n + 1) / 2;
  Shape contiguous{"contiguous", {iota_ranks(0, half)}};
  if (half < n) contiguous.groups.push_back(iota_ranks(half, n));
  shapes.push_back(contiguous);
  auto reversed = iota_ranks(0, n);
  std::reverse(reversed.begin(), reversed.end());
  shapes.push_back({"reversed", {reversed}});
  Shape odd_even{"odd_even", {{}, {}}};
  for (int r = 0; r < n; ++r) odd_even.groups[r % 2].push_back(r);
  if (odd_even.groups[1].empty()) odd_even.groups.pop_back();
  shapes.push_back(odd_even);
  Shape single{"single_rank", {}};
  for (int r = 0; r < n; ++r) single.groups.push_back({r});
  shapes.push_back(single);
  if (n >= 2) shapes.push_back({"without_rank0", {iota_ranks(1, n)}});
  else impossible->push_back("without_rank0: needs 2 or more ranks");
  // Level one: the world reversed; level two: its first half (reversed again)
  // and the rest, in the parent's ranks.
  Shape two{"two_levels", {}, true};
  auto first = iota_ranks(0, half);
  std::reverse(first.begin(), first.end());
  two.groups.push_back(first);
  if (half < n) two.groups.push_back(iota_ranks(half, n));
  shapes.push_back(two);
  return shapes;
}

// Aborts the comms of a case that outlives its time limit, so that every op
// it is blocked in fails and the case ends.
class Watchdog {
 public:
  Watchdog() : thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void arm(std::vector<Comm*> targets, std::chrono::milliseconds limit) {
    std::lock_guard lock(mu_);
    targets_ = std::move(targets);
    deadline_ = std::chrono::steady_clock::now() + limit;
    armed_ = true;
    fired_ = false;
    cv_.notify_all();
  }
  // Returns whether it fired.
  bool disarm() {
    std::lock_guard lock(mu_);
    armed_ = false;
    targets_.clear();
    return fired_;
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
          std::chrono::steady_clock::now() >= deadline_) {
        for (Comm* c : targets_) c->abort("comms-conformance: case time limit exceeded");
        fired_ = true;
        armed_ = false;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false, fired_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<Comm*> targets_;
  std::thread thread_;
};

struct Result {
  std::string name, group, status, reason;
};

constexpr uint64_t kRanBit = uint64_t(1) << 63;
// The case ended in kUnsupported from an op the backend does not claim.
constexpr uint64_t kUnclaimedBit = uint64_t(1) << 62;
constexpr int kMaxRankBits = 62;

std::string rank_list(uint64_t mask) {
  std::string s;
  for (int r = 0; r < kMaxRankBits; ++r) {
    if (mask & (uint64_t(1) << r)) s += (s.empty() ? "" : ",") + std::to_string(r) + (r == kMaxRankBits - 1 ? "+" : "");
  }
  return s;
}

class Suite {
 public:
  Suite(SuiteOptions options, Claims claims, std::shared_ptr<Comm> world, DeviceMemory& memory, int rank, int size)
      : options_(std::move(options)),
        claims_(std::move(claims)),
        world_(std::move(world)),
        memory_(memory),
        rank_(rank),
        size_(size) {}

  // Runs cases whose comm is `comm` on this rank (null: not a member).
  void run(std::vector<Case>& cases, Comm* comm) {
    for (auto& c : cases) {
      if (!selected(options_, c.name)) continue;
      if (c.skip_reason.empty()) c.skip_reason = claims_.unclaimed(c.name);
      run_one(c, comm);
      if (pending_.size() >= 64) flush();
    }
    flush();
  }

  void add_skipped(const std::string& name, const std::string& group, const std::string& reason) {
    if (!selected(options_, name)) return;
    pending_.push_back({{name, group, "skipped", reason}, 0, "", 0});
    flush();
  }

  bool any_case_matches(const std::vector<Case>& cases) const {
    for (auto& c : cases) {
      if (selected(options_, c.name)) return true;
    }
    return false;
  }

  int finish() {
    // A --require glob that no case matched: what the plugin must pass is not there.
    for (const auto& glob : options_.required) {
      if (required_seen_.count(glob) == 0) {
        ++failed_;
        if (rank_ == 0) std::printf("FAIL --require '%s': no case of this run matches it\n", glob.c_str());
      }
    }
    if (rank_ == 0) print_summary();
    return failed_ > 0 ? 1 : 0;
  }

  Watchdog& watchdog() { return watchdog_; }

 private:
  struct Pending {
    Result result;
    uint64_t flags;  // kRanBit if it ran here; bit r if it failed on rank r
    std::string local_failure;
    double seconds = 0;  // on this rank
  };

  // The ops the UCX zero-copy path runs (zero_copy_kernels.h), by the op
  // part of a case's name ("<shape>/<op>/...").
  static bool zero_copy_op(const std::string& case_name) {
    const size_t a = case_name.find('/'), b = case_name.find('/', a + 1);
    const std::string op = case_name.substr(a + 1, b - a - 1);
    return op == "all_reduce" || op == "reduce" || op == "reduce_scatter" || op == "all_gather" || op == "broadcast";
  }
  // -1 where the backend reports no such count.
  static int64_t zero_copy_ops(const Comm& comm) {
    const auto j = nlohmann::json::parse(comm.describe(), nullptr, false);
    const nlohmann::json::json_pointer at("/backends/cpu/config/zero_copy/ops");
    return !j.is_discarded() && j.contains(at) && j.at(at).is_number() ? j.at(at).get<int64_t>() : -1;
  }

  void run_one(Case& c, Comm* comm) {
    Pending p{{c.name, c.group, "", c.skip_reason}, 0, "", 0};
    const auto t0 = std::chrono::steady_clock::now();
    if (c.skip_reason.empty() && comm != nullptr) {
      Checker check(rank_, comm->rank());
      CaseContext cx{*comm, check, options_, *world_, memory_};
      std::vector<Comm*> targets = {comm};
      if (comm != world_.get()) targets.push_back(world_.get());
      const bool zero_copy = options_.expect_zero_copy && comm->size() >= 2 && zero_copy_op(c.name);
      const int64_t zero_copy_before = zero_copy ? zero_copy_ops(*comm) : 0;
      watchdog_.arm(targets, options_.case_timeout);
      try {
        c.body(cx);
      } catch (const Error& e) {
        // An op the backend does not claim may answer kUnsupported: a skip.
        if (claims_.declared && e.code() == ErrorCode::kUnsupported && !e.op().empty() &&
            !claims_.claims_op(e.op())) {
          p.flags |= kUnclaimedBit;
          p.result.reason = claims_.not_claimed(e.op());
        } else {
          check.fail(std::string("case threw: ") + e.what());
        }
      } catch (const std::exception& e) {
        check.fail(std::string("case threw: ") + e.what());
      }
      if (watchdog_.disarm()) {
        check.fail("case exceeded its time limit of " + std::to_string(options_.case_timeout.count() / 1000) +
                   " s; its comms were aborted");
      }
      if (zero_copy && !check.failed()) {
        const int64_t after = zero_copy_ops(*comm);
        if (after <= zero_copy_before) {
          check.fail("no op of the case ran zero-copy: describe()'s backends.cpu.config.zero_copy.ops stayed at " +
                     std::to_string(after));
        }
      }
      p.flags |= kRanBit;
      if (check.failed()) {
        p.flags |= uint64_t(1) << std::min(rank_, kMaxRankBits - 1);
        p.local_failure = check.first_failure();
        // Every rank reports its own failure; rank 0 reports which ranks failed.
        if (rank_ != 0) std::printf("FAIL detail %s: %s\n", c.name.c_str(), p.local_failure.c_str());
        std::fflush(stdout);
      }
    }
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pending_.push_back(std::move(p));
  }

  // Combines the pending cases over the world and prints them on rank 0.
  void flush() {
    if (pending_.empty()) return;
    std::vector<uint64_t> flags;
    for (auto& p : pending_) flags.push_back(p.flags);
    // Without a world comm (the --device cuda skip path) nothing ran anywhere.
    if (size_ > 1 && world_) {
      try {
        flags = or_over_store(flags);
      } catch (const Error& e) {
        // Without the store no result can be combined: report what this rank
        // saw and stop, failing.
        std::printf("FAIL combining the ranks' results over the store failed: %s\n", e.what());
        for (auto& p : pending_) p.flags |= uint64_t(1) << std::min(rank_, kMaxRankBits - 1);
        record(flags);
        pending_.clear();
        std::printf("%d passed, %d failed, %d skipped\n", passed_, failed_, skipped_);
        std::fflush(stdout);
        std::_Exit(1);
      }
    }
    record(flags);
    pending_.clear();
  }

  // Every rank's flags OR-ed together, exchanged over the world's store, not
  // over the backend under test: a backend without all_gather (or with a
  // broken one) still gets its results counted. Each rank writes its flags
  // under the round's key and reads every rank's.
  std::vector<uint64_t> or_over_store(const std::vector<uint64_t>& mine) {
    Store& store = *world_->store();
    const size_t bytes = mine.size() * sizeof(uint64_t);
    auto key = [](uint64_t round, int rank) {
      return "comms-conformance/results/" + std::to_string(round) + "/" + std::to_string(rank);
    };
    store.set(key(round_, rank_), std::string(reinterpret_cast<const char*>(mine.data()), bytes));
    std::vector<uint64_t> combined(mine.size(), 0);
    for (int r = 0; r < size_; ++r) {
      const std::string theirs = store.get(key(round_, r), options_.case_timeout);
      if (theirs.size() != bytes) {
        throw Error(ErrorCode::kInternal, "rank " + std::to_string(r) + " reported " +
                                              std::to_string(theirs.size() / sizeof(uint64_t)) + " results, this rank " +
                                              std::to_string(mine.size()) + ": the ranks ran different cases");
      }
      for (size_t j = 0; j < mine.size(); ++j) {
        uint64_t f;
        std::memcpy(&f, theirs.data() + j * sizeof(uint64_t), sizeof f);
        combined[j] |= f;
      }
    }
    // Every rank has read round - 2 (it wrote round - 1 after reading it).
    if (round_ >= 2) store.delete_key(key(round_ - 2, rank_));
    ++round_;
    return combined;
  }

  void record(const std::vector<uint64_t>& flags) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      Result r = pending_[i].result;
      uint64_t f = flags[i];
      const uint64_t failed_ranks = f & ~(kRanBit | kUnclaimedBit);
      const bool required = matches_any(options_.required, r.name);
      for (const auto& glob : options_.required) {
        if (fnmatch(glob.c_str(), r.name.c_str(), 0) == 0) required_seen_.insert(glob);
      }
      if ((f & kUnclaimedBit) && !failed_ranks) {
        f &= ~kRanBit;  // reported as skipped below
        if (r.reason.empty()) r.reason = "an op the backend does not claim answered unsupported";
      }
      if (!failed_ranks && required && !(f & kRanBit && r.reason.empty())) {
        r.status = "failed";
        r.reason = "required (--require) but not run: " +
                   (r.reason.empty() ? std::string("no rank is a member of a group this case can run on") : r.reason);
        ++failed_;
      } else if (failed_ranks) {
        r.status = "failed";
        r.reason = "failed on rank(s) " + rank_list(failed_ranks);
        if (!pending_[i].local_failure.empty()) r.reason += ": " + pending_[i].local_failure;
        else r.reason += " (see their FAIL detail lines)";
        ++failed_;
      } else if (r.reason.empty() && (f & kRanBit)) {
        r.status = "passed";
        ++passed_;
      } else {
        r.status = "skipped";
        if (r.reason.empty()) r.reason = "no rank is a member of a group this case can run on";
        ++skipped_;
      }
      if (rank_ == 0) {
        // Slow cases show their time, to keep the suite's budget visible.
        const double secs = pending_[i].seconds;
        if (r.status == "passed" && secs >= 0.5) std::printf("PASS %s (%.1f s)\n", r.name.c_str(), secs);
        else if (r.status == "passed") std::printf("PASS %s\n", r.name.c_str());
        else if (r.status == "failed") std::printf("FAIL %s: %s\n", r.name.c_str(), r.reason.c_str());
        else std::printf("SKIP %s: %s\n", r.name.c_str(), r.reason.c_str());
      }
      auto& row = table_[r.group];
      (r.status == "passed" ? row[0] : r.status == "failed" ? row[1] : row[2])++;
      results_.push_back(std::move(r));
    }
    std::fflush(stdout);
  }

  void print_summary() {
    std::printf("\n%-22s %8s %8s %8s\n", "case group", "passed", "failed", "skipped");
    for (auto& [group, row] : table_) std::printf("%-22s %8d %8d %8d\n", group.c_str(), row[0], row[1], row[2]);
    if (!options_.json_path.empty()) {
      nlohmann::json j;
      j["backend"] = options_.backend;
      j["device"] = options_.device.to_string();
      j["device_name"] = memory_.describe();
      j["world_size"] = size_;
      j["passed"] = passed_;
      j["failed"] = failed_;
      j["skipped"] = skipped_;
      for (auto& r : results_) {
        j["cases"].push_back({{"name", r.name}, {"group", r.group}, {"status", r.status}, {"reason", r.reason}});
      }
      if (options_.json_path == "-") {
        std::fprintf(g_json_stdout, "%s\n", j.dump(2).c_str());
        std::fflush(g_json_stdout);
      } else {
        std::ofstream(options_.json_path) << j.dump(2) << "\n";
      }
    }
    std::printf("%d passed, %d failed, %d skipped\n", passed_, failed_, skipped_);
    std::fflush(stdout);
  }

  SuiteOptions options_;
  Claims claims_;
  std::set<std::string> required_seen_;
  uint64_t round_ = 0;
  std::shared_ptr<Comm> world_;
  DeviceMemory& memory_;
  int rank_, size_;
  Watchdog watchdog_;
  std::vector<Pending> pending_;
  std::vector<Result> results_;
  std::map<std::string, std::array<int, 3>> table_;
  int passed_ = 0, failed_ = 0, skipped_ = 0;
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : " ") + i;
  return out;
}

// Why --device cuda cannot run here, or "" if it could.
std::string cuda_unavailable(const std::string& backend) {
  try {
    // The default map only has a cuda entry when a CUDA device is present.
    const BackendSpec spec = BackendSpec::parse(backend);
    if (!spec.has(DeviceType::kCuda)) return "no CUDA device (backend '" + spec.to_string() + "' has no cuda entry)";
    if (plugin_device_count(spec.backend_for(DeviceType::kCuda), DeviceType::kCuda) <= 0) return "no CUDA device";
  } catch (const Error& e) {
    return std::string("no CUDA device (") + e.what() + ")";
  }
  return "";
}

// The shape's groups through comms::dist: new_group for each list (every
// rank calls it for every list, c10d style), so COMMS_ROUTE picks direct
// bootstraps or splits of the world. Two levels: a reversed world first,
// then split_group of it (global ranks).
std::shared_ptr<Comm> dist_groups(const Shape& shape, int size) {
  auto member_of = [](const std::vector<dist::Group>& made) {
    for (const auto& g : made) {
      if (g) return g.shared_comm();
    }
    return std::shared_ptr<Comm>();
  };
  if (!shape.two_levels) {
    std::vector<dist::Group> made;
    for (const auto& list : shape.groups) made.push_back(dist::new_group(list));
    return member_of(made);
  }
  auto reversed = iota_ranks(0, size);
  std::reverse(reversed.begin(), reversed.end());
  dist::Group parent = dist::new_group(reversed);
  // shape.groups are ranks of the reversed parent; split_group takes global ranks.
  std::vector<std::vector<int>> global;
  for (const auto& list : shape.groups) {
    global.emplace_back();
    for (int r : list) global.back().push_back(reversed[static_cast<size_t>(r)]);
  }
  dist::Group mine = dist::split_group(parent, global);
  return mine ? mine.shared_comm() : nullptr;
}

int run_suite(SuiteOptions options) {
  const BootstrapInfo boot = bootstrap_from_environment();
  const int rank = boot.rank, size = boot.world_size;

  // Buffers on the host, or on this rank's GPU (its local rank), through one
  // stream that every op of the suite runs on.
  std::string cuda_skip;
  std::unique_ptr<DeviceMemory> memory = host_memory();
  Device device = Device::cpu();
  if (options.device.type == DeviceType::kCuda && options.stand_in_device) {
    memory = stand_in_cuda_memory(boot.local_rank);
  } else if (options.device.type == DeviceType::kCuda) {
    cuda_skip = cuda_unavailable(options.backend);
    if (cuda_skip.empty()) {
      memory = cuda_memory(boot.local_rank, boot.local_world_size, options.case_timeout, &cuda_skip);
      if (!memory) memory = host_memory();
    }
  }
  if (options.device.type == DeviceType::kCuda) device = memory->device();
  bool bind = true;
  std::shared_ptr<Comm> world;
  Capabilities caps;
  Claims claims;
  if (cuda_skip.empty()) {
    const BackendSpec spec = BackendSpec::parse(options.backend);
    if (spec.has(device.type)) claims = Claims::of(plugin_info(spec.backend_for(device.type)));
    // Binding a comm to a device proves it with a barrier: a backend that
    // does not claim barrier connects at its first op instead.
    if (claims.declared && !claims.claims_op("barrier")) {
      if (device.type != DeviceType::kCpu) {
        throw Error(ErrorCode::kInvalidArgument, "backend '" + claims.plugin +
                                                     "' does not claim barrier, which binding a " +
                                                     device.to_string() + " comm needs");
      }
      bind = false;
    }
    if (env::get("COMMS_ROUTE")) {
      // Under COMMS_ROUTE the groups come from comms::dist, so the route
      // decides how each one is made (a fresh rendezvous, or Comm::split).
      dist::InitOptions init;
      init.backend = options.backend;
      if (bind) init.device = device;
      init.timeout = options.op_timeout;
      world = dist::init_process_group(init).shared_comm();
    } else {
      CommOptions co;
      co.op_timeout = options.op_timeout;
      world = new_comm(options.backend, bind ? std::optional<Device>(device) : std::nullopt, "conformance-world", co);
    }
    options.backend = world->backend_string();
    if (options.backend_memory) {
      if (device.type != DeviceType::kCpu) throw Error(ErrorCode::kInvalidArgument, "--backend-memory is for --device cpu");
      memory = backend_memory(world);
      // A backend without an allocator is refused here, once, rather than
      // by every case's first buffer.
      try {
        memory->release(alloc_backend_memory(*world, device, 64));
      } catch (const Error& e) {
        throw Error(e.code(), std::string("--backend-memory: ") + e.what());
      }
    }
    if (claims.declared) {
      caps.from_claims(claims);
    } else {
      caps.probe(*world, *memory);
    }
  }
  const bool via_dist = dist::is_initialized();
  if (rank == 0) {
    // On cuda, the GPU rank 0 runs on (name, compute capability), so that
    // every report says which GPU it came from.
    std::printf("comms-conformance: backend %s, device %s, world size %d%s%s\n",
                options.backend.empty() ? "(default)" : options.backend.c_str(),
                (cuda_skip.empty() && device.type == DeviceType::kCuda) || options.backend_memory
                    ? memory->describe().c_str()
                                                                      : options.device.to_string().c_str(),
                size, options.quick ? ", quick" : "",
                via_dist ? (std::string(", groups by comms::dist, route ") +
                            std::string(dist::to_string(dist::route_from_environment())))
                               .c_str()
                         : "");
    std::fflush(stdout);
  }

  if (rank == 0 && claims.declared) {
    std::printf("backend '%s' claims ops: %s\n", claims.plugin.c_str(), join(claims.ops).c_str());
  }
  Suite suite(options, claims, world, *memory, rank, size);
  std::vector<std::string> impossible;
  const std::vector<Shape> shapes = shapes_for(size, &impossible);
  for (const auto& why : impossible) {
    suite.add_skipped(why.substr(0, why.find(':')) + "/*", "shapes",
                      cuda_skip.empty() ? why.substr(why.find(':') + 2) : cuda_skip);
  }

  for (const Shape& shape : shapes) {
    Group group{shape.name, nullptr, {}};
    for (auto& g : shape.groups) group.group_sizes.push_back(int(g.size()));
    std::vector<Case> cases;
    SuiteOptions shape_options = options;
    add_op_cases(group, caps, shape_options, &cases);
    if (shape.name == "world" || shape.name == "two_levels") add_error_cases(shape.name, group, &cases);
    if (!cuda_skip.empty()) {
      for (auto& c : cases) c.skip_reason = cuda_skip;
      suite.run(cases, nullptr);
      continue;
    }
    if (!suite.any_case_matches(cases)) continue;

    // Creating the groups is collective over the world: every rank does it.
    std::shared_ptr<Comm> parent, comm;
    try {
      if (shape.name == "world") {
        comm = world;
      } else if (via_dist) {
        comm = dist_groups(shape, size);
      } else if (shape.two_levels) {
        auto reversed = iota_ranks(0, size);
        std::reverse(reversed.begin(), reversed.end());
        parent = world->split(reversed, "conformance-two-levels-parent");
        comm = parent->split_group(shape.groups, "conformance-two-levels");
      } else {
        comm = world->split_group(shape.groups, "conformance-" + shape.name);
      }
    } catch (const Error& e) {
      std::printf("FAIL creating the %s groups: %s\n", shape.name.c_str(), e.what());
      for (auto& c : cases) {
        c.skip_reason = "";
        c.body = [msg = std::string(e.what())](CaseContext& cx) { cx.check.fail("group creation failed: " + msg); };
      }
      comm = world;  // reports the failure on every rank
    }
    suite.run(cases, comm.get());
    if (comm != world) {
      for (auto* c : {&comm, &parent}) {
        if (*c) {
          try {
            (*c)->finalize();
          } catch (const Error& e) {
            std::printf("warning: finalize of %s failed: %s\n", (*c)->name().c_str(), e.what());
          }
        }
      }
    }
  }

  std::vector<Case> lifecycle;
  add_lifecycle_cases(size, options, &lifecycle);
  if (world) {
    const BackendSpec spec = BackendSpec::parse(options.backend);
    add_window_cases(has_windows(*world, device.type),
                     std::string(to_string(device.type)) + ":" + spec.backend_for(device.type), options, &lifecycle);
  }
  if (!cuda_skip.empty()) {
    for (auto& c : lifecycle) c.skip_reason = cuda_skip;  // no world comm on this path
  }
  suite.run(lifecycle, world.get());
  const int status = suite.finish();
  if (world) {
    try {
      world->finalize();
    } catch (const Error& e) {
      std::printf("warning: finalize of the world failed: %s\n", e.what());
    }
  }
  return status;
}

}  // namespace
}  // namespace comms::conformance

int main(int argc, char** argv) {
  using comms::conformance::SuiteOptions;
  CLI::App app{"comms-conformance: the backend conformance suite. Run it under a launcher, e.g.\n"
               "  commsrun -n 4 -- comms-conformance --backend cpu:gloo"};
  SuiteOptions options;
  options.backend = comms::env::get("COMMS_BACKEND").value_or("");
  std::string device = "cpu";
  double op_timeout_s = 60, case_timeout_s = 120;
  app.add_option("--backend", options.backend, "backend string (default: COMMS_BACKEND)");
  app.add_option("--device", device, "buffer device")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--plugin", options.plugin, "a backend plugin file (.so) to load and test");
  app.add_option("--filter", options.filters,
                 "run only cases whose name matches one of these globs, e.g. 'world/all_reduce/*' "
                 "(repeat the flag or separate globs with commas)")
      ->delimiter(',');
  app.add_option("--exclude", options.excludes, "skip cases whose name matches one of these globs")
      ->delimiter(',');
  app.add_option("--require", options.required,
                 "cases (globs) the backend must pass: a skip of one, or a glob matching no case, fails the run")
      ->delimiter(',');
  app.add_flag("--quick", options.quick, "fewer counts and roots");
  app.add_flag("--backend-memory", options.backend_memory,
               "every cpu buffer from the comm's allocator (alloc_backend_memory), for a backend that has one");
  app.add_flag("--expect-zero-copy", options.expect_zero_copy,
               "with --backend-memory on cpu:ucx: each case of all_reduce, reduce, reduce_scatter, all_gather "
               "and broadcast on 2+ ranks must run ops zero-copy (describe()'s zero_copy.ops rises; set "
               "COMMS_UCX_ZERO_COPY_MIN_BYTES=0 so every size qualifies)");
  app.add_option("--json", options.json_path,
                 "also write the results as JSON to FILE (rank 0); '-': stdout, which then carries the JSON alone "
                 "(the report goes to stderr)");
  app.add_option("--op-timeout", op_timeout_s, "timeout of every op, in seconds");
  app.add_option("--case-timeout", case_timeout_s, "time limit of one case, in seconds");
  // Hidden: the suite's own test of its cuda paths (with the selfcuda plugin).
  app.add_flag("--stand-in-device", options.stand_in_device,
               "with --device cuda: host memory labelled cuda, for a plugin that moves it as host memory")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (options.json_path == "-") {
    // Every rank: commsrun passes each rank's stdout on, and any line there
    // (the report, a warning, a plugin's) would break the JSON.
    const int json_fd = dup(STDOUT_FILENO);
    comms::conformance::g_json_stdout = json_fd >= 0 ? fdopen(json_fd, "w") : nullptr;
    if (!comms::conformance::g_json_stdout || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
      std::fprintf(stderr, "comms-conformance: --json -: cannot move the report off stdout: %s\n",
                   std::strerror(errno));
      return 2;
    }
  }

  try {
    options.device = comms::Device::parse(device);
    options.op_timeout = std::chrono::milliseconds(static_cast<int64_t>(op_timeout_s * 1000));
    options.case_timeout = std::chrono::milliseconds(static_cast<int64_t>(case_timeout_s * 1000));
    if (!options.plugin.empty()) {
      const auto loaded = comms::load_plugin(options.plugin);
      options.backend = device + ":" + loaded.name;
    }
    return comms::conformance::run_suite(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comms-conformance: %s\n", e.what());
    std::printf("0 passed, 1 failed, 0 skipped\n");
    return 1;
  }
}
