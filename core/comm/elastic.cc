// comms/elastic.h: revoke, the agreement on the failed set, the shrink's
// commit, recover, and the per-step vote. Every decision is one record
// written once with compare_set, so every rank reads the same answer; the
// ranks only differ in when they stop waiting for it, and whoever stops
// first writes the record from what the store shows then.
#include "comms/elastic.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "comm/comm_impl.h"
#include "comm/elastic_watch.h"
#include "config/env.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kDefaultLiveness{1000};
// How long one wait for a decision record blocks before looking at who is
// missing: a server-side wait, so a decision wakes it at once.
constexpr milliseconds kDecisionPoll{50};

Comm::Impl& impl_of(const Comm& comm) { return internal::CommAccess::impl(comm); }

milliseconds liveness_timeout(const AgreeOptions& o) {
  if (o.liveness_timeout) return *o.liveness_timeout;
  if (auto v = env::get_duration("COMMS_ELASTIC_LIVENESS_TIMEOUT")) return *v;
  return kDefaultLiveness;
}

// Which ranks are gone: their process ended on this host (seen at once), or
// their heartbeat stood still for the liveness timeout since this rank first
// looked (another host, or a stopped process). A process on this host that
// runs is alive, however late its heartbeat: on a loaded machine a watcher
// thread can miss its ticks for seconds.
class Liveness {
 public:
  Liveness(Store& store, const Comm::Impl& comm, milliseconds timeout)
      : store_(store), comm_(comm), timeout_(timeout) {}

  bool dead(int rank) {
    auto key = keys_.find(rank);
    if (key == keys_.end()) {
      // Written when the comm was created, before it connected; if it is
      // not there, only the deadline can tell.
      Process p;
      try {
        p.heartbeat = internal::heartbeat_key_of(store_, comm_.config().rendezvous_ns, rank, timeout_, &p.pid);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kTimeout) throw;
      }
      key = keys_.emplace(rank, p).first;
    }
    if (key->second.pid >= 0) {
      const internal::LocalState state = internal::local_state(key->second.pid);
      if (state == internal::LocalState::kEnded) return true;
      if (state == internal::LocalState::kRunning) return false;
    }
    if (key->second.heartbeat.empty()) return false;
    const int64_t beat = store_.add(key->second.heartbeat, 0);
    const auto now = Clock::now();
    auto [it, first] = seen_.try_emplace(rank, beat, now);
    if (first || it->second.first != beat) {
      it->second = {beat, now};
      return false;
    }
    return now - it->second.second >= timeout_;
  }

 private:
  Store& store_;
  const Comm::Impl& comm_;
  milliseconds timeout_;
  struct Process {
    std::string heartbeat;  // its counter's key ("": unknown)
    int pid = -1;           // on this host, else -1
  };
  std::map<int, std::pair<int64_t, Clock::time_point>> seen_;
  std::map<int, Process> keys_;
};

// Waits for `record`, which some rank writes once; `decide` is asked between
// waits and returns the value to propose once this rank can decide (nullopt:
// keep waiting). Returns the record's value.
template <class Decide>
std::string await_record(Store& store, const std::string& record, Decide&& decide) {
  while (true) {
    try {
      return store.get(record, kDecisionPoll);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
    }
    if (auto proposal = decide()) return store.compare_set(record, "", *proposal);
  }
}

std::string encode_ranks(const std::vector<int>& ranks) { return str::cat("ranks:", str::join(ranks, ",")); }

std::vector<int> decode_ranks(const std::string& text) {
  std::vector<int> out;
  const std::string_view body = std::string_view(text).substr(text.find(':') + 1);
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find(',', start);
    if (end == std::string_view::npos) end = body.size();
    out.push_back(std::stoi(std::string(body.substr(start, end - start))));
    start = end + 1;
  }
  return out;
}

// The ranks of `all` (excluding `skip`) whose key "<dir>/<rank>" is still
// missing; those found are remembered in `present`.
std::vector<int> missing_ranks(Store& store, const std::string& dir, int size, const std::set<int>& skip,
                               std::set<int>& present) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (skip.count(r) || present.count(r)) continue;
    if (store.check({str::cat(dir, "/", r)})) {
      present.insert(r);
    } else {
      missing.push_back(r);
    }
  }
  return missing;
}

struct Waiting {
  Liveness live;
  Clock::time_point deadline;
  // Whether every rank in `missing` is dead, or the deadline passed.
  bool give_up_on(const std::vector<int>& missing) {
    if (Clock::now() >= deadline) return true;  // (missing is never empty here)
    bool all_dead = true;
    for (int r : missing) all_dead = live.dead(r) && all_dead;  // look at each: it starts their clocks
    return all_dead;
  }
};

Waiting waiting(Comm::Impl& impl, const AgreeOptions& o) {
  const milliseconds timeout = o.timeout.value_or(impl.op_timeout());
  return Waiting{Liveness(*impl.config().store, impl, liveness_timeout(o)), Clock::now() + timeout};
}

std::string agree_dir(const Comm::Impl& impl, int round) {
  return str::cat(impl.config().rendezvous_ns, "/elastic/agree/r", round);
}

Error elastic_error(const Comm::Impl& impl, ErrorCode code, const std::string& what, const char* op) {
  return impl.error(code, what, op);
}

void need_store(const Comm::Impl& impl, const char* op) {
  if (!impl.config().store) {
    throw elastic_error(impl, ErrorCode::kUnsupported, "elastic recovery needs the comm's store", op);
  }
}

// Agreements tell a dead rank from a slow one by the heartbeats, and a
// revocation reaches the other ranks through their watchers: both exist only
// for elastic comms (a planned shrink needs neither).
void need_elastic(const Comm::Impl& impl, const char* op) {
  need_store(impl, op);
  if (auto why = internal::store_lost(*impl.config().store)) {
    throw elastic_error(impl, ErrorCode::kPeerFailure,
                        str::cat(op, ": the job's store is lost (", *why, "): no agreement can run without it"), op);
  }
  if (!impl.config().elastic && impl.config().size > 1) {
    throw elastic_error(impl, ErrorCode::kInvalidArgument,
                        str::cat(op, ": the comm is not elastic, so its ranks neither heartbeat nor watch for "
                                     "revocations; create it with CommOptions::elastic = true or COMMS_ELASTIC=1 "
                                     "(commsrun --keep-going sets it)"),
                        op);
  }
}

// A store call that failed inside an elastic call throws an error about no
// comm: make it this comm's, saying that the store is what failed.
template <class F>
auto through_store(const Comm::Impl& impl, const char* op, F&& call) {
  try {
    return call();
  } catch (const Error& e) {
    if (!e.comm().empty()) throw;
    throw elastic_error(impl, e.code() == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeerFailure,
                        str::cat(op, ": the job's store failed (", e.what(), "); elastic recovery cannot work without it"),
                        op);
  }
}

}  // namespace

void Comm::Impl::revoke_local(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (revoked_.exchange(true)) return;
  for (auto& s : device_backends_) {
    const BackendState st = s.state.load();
    if (st == BackendState::kAbsent || st == BackendState::kOffloaded) continue;
    s.failure = reason;  // the error's code already says "revoked"
    s.state = BackendState::kFailed;
    if (st == BackendState::kFailed || !s.backend) continue;  // aborted when it failed
    // ABI 2.4 plugins get revoke(), which may keep what their native shrink needs.
    const bool has_revoke = plugin::abi_minor(s.plugin->descriptor->abi_version) >= 4;
    const Status called = internal::call_plugin(s.plugin->name, has_revoke ? "revoke" : "abort", [&] {
      if (has_revoke) s.backend->revoke(str::cat("revoked: ", reason));
      else s.backend->abort(str::cat("revoked: ", reason));
      return Status{};
    });
    if (!called.is_ok()) log::error(str::cat(prefix(), " revoke: ", called.message));
  }
}

void revoke(Comm& comm, const std::string& reason) {
  Comm::Impl& impl = impl_of(comm);
  if (impl.config().size > 1 && !impl.config().elastic) need_elastic(impl, "revoke");
  const bool first = !impl.is_revoked();
  impl.revoke_local(reason);
  if (first && impl.config().store && impl.config().size > 1) {
    through_store(impl, "revoke", [&] {
      internal::publish_revocation(*impl.config().store, impl.config().rendezvous_ns,
                                   str::cat(reason, " (rank ", impl.config().rank, ")"));
    });
  }
}

bool is_revoked(const Comm& comm) { return impl_of(comm).is_revoked(); }

uint64_t epoch(const Comm& comm) { return impl_of(comm).config().epoch; }

namespace {

Agreement agree_unguarded(Comm& comm, const AgreeOptions& options) {
  Comm::Impl& impl = impl_of(comm);
  need_elastic(impl, "agree");
  Store& store = *impl.config().store;
  const int rank = impl.config().rank, size = impl.config().size;
  const int round = impl.elastic().round;
  const std::set<int> before(impl.elastic().lost.begin(), impl.elastic().lost.end());
  const std::string dir = agree_dir(impl, round);
  store.set(str::cat(dir, "/alive/", rank), "1");
  const int64_t expected = size - static_cast<int64_t>(before.size());
  const bool last = store.add(dir + "/arrived", 1) >= expected;
  Waiting wait = waiting(impl, options);
  std::set<int> present{rank};
  const auto decide = [&]() -> std::optional<std::string> {
    if (last || store.add(dir + "/arrived", 0) >= expected) return encode_ranks({before.begin(), before.end()});
    std::vector<int> missing = missing_ranks(store, dir + "/alive", size, before, present);
    if (!missing.empty() && !wait.give_up_on(missing)) return std::nullopt;
    std::set<int> lost = before;
    lost.insert(missing.begin(), missing.end());
    return encode_ranks({lost.begin(), lost.end()});
  };
  const std::string record = last ? store.compare_set(dir + "/decision", "", *decide())
                                  : await_record(store, dir + "/decision", decide);
  Agreement a{impl.config().epoch + 1, decode_ranks(record), round};
  if (std::binary_search(a.lost.begin(), a.lost.end(), rank)) {
    throw elastic_error(impl, ErrorCode::kPeerFailure,
                        str::cat("agree: the other ranks declared this rank lost (it joined round ", round,
                                 " too late; lost: [", str::join(a.lost, ","), "])"),
                        "agree");
  }
  impl.elastic().lost = a.lost;
  return a;
}

std::shared_ptr<Comm> shrink_unguarded(Comm& comm, const Agreement& agreement) {
  Comm::Impl& impl = impl_of(comm);
  need_elastic(impl, "shrink");
  Store& store = *impl.config().store;
  std::vector<int> members;
  for (int r = 0; r < impl.config().size; ++r) {
    if (!std::binary_search(agreement.lost.begin(), agreement.lost.end(), r)) members.push_back(r);
  }
  std::shared_ptr<Comm> child;
  std::string failure;
  try {
    child = impl.shrink_to(members, agreement.epoch, str::cat("/elastic/shrink-e", agreement.epoch, "-r",
                                                              agreement.round));
  } catch (const Error& e) {
    failure = e.what();
  }
  // Commit: the new comm counts only when every member built it.
  const std::string dir = agree_dir(impl, agreement.round);
  std::string record;
  if (child) {
    store.set(str::cat(dir, "/joined/", impl.config().rank), "1");
    std::vector<std::string> keys;
    for (int r : members) keys.push_back(str::cat(dir, "/joined/", r));
    Waiting wait = waiting(impl, {});
    const std::set<int> outside(agreement.lost.begin(), agreement.lost.end());
    std::set<int> present;
    record = await_record(store, dir + "/commit", [&]() -> std::optional<std::string> {
      const auto missing = missing_ranks(store, dir + "/joined", impl.config().size, outside, present);
      if (missing.empty()) return "ok";
      if (wait.give_up_on(missing)) return "fail";
      return std::nullopt;
    });
  } else {
    record = store.compare_set(dir + "/commit", "", "fail");
  }
  if (record == "ok" && child) return child;
  if (child) child->abort("a survivor did not join the shrunk comm");
  child.reset();
  ++impl.elastic().round;
  throw elastic_error(impl, ErrorCode::kPeerFailure,
                      str::cat("shrink: not every survivor built the comm of epoch ", agreement.epoch,
                               failure.empty() ? "" : str::cat(" (here: ", failure, ")"),
                               "; agree again (recover() does)"),
                      "shrink");
}

}  // namespace

Agreement agree_on_failures(Comm& comm, const AgreeOptions& options) {
  return through_store(impl_of(comm), "agree", [&] { return agree_unguarded(comm, options); });
}

std::shared_ptr<Comm> shrink(Comm& comm, const Agreement& agreement) {
  return through_store(impl_of(comm), "shrink", [&] { return shrink_unguarded(comm, agreement); });
}

std::shared_ptr<Comm> shrink(Comm& comm, std::span<const int> exclude) {
  Comm::Impl& impl = impl_of(comm);
  std::set<int> out;
  for (int r : exclude) {
    if (r < 0 || r >= impl.config().size || !out.insert(r).second) {
      throw elastic_error(impl, ErrorCode::kInvalidArgument,
                          str::cat("shrink: exclude list [", str::join(std::vector<int>(exclude.begin(), exclude.end()), ","),
                                   "] has rank ", r, ", outside [0, ", impl.config().size, ") or twice"),
                          "shrink");
    }
  }
  if (out.size() == static_cast<size_t>(impl.config().size)) {
    throw elastic_error(impl, ErrorCode::kInvalidArgument, "shrink: the exclude list leaves no rank", "shrink");
  }
  std::vector<int> members;
  for (int r = 0; r < impl.config().size; ++r) {
    if (!out.count(r)) members.push_back(r);
  }
  const uint64_t next = impl.config().epoch + 1;
  const std::string excluded = str::join(std::vector<int>(out.begin(), out.end()), "_");
  const std::string base = str::cat("/elastic/planned-e", next, "-x", excluded);
  const std::string suffix = str::cat(base, "-i", internal::next_incarnation(impl.config().rendezvous_ns + base));
  return impl.shrink_to(members, next, suffix, str::cat("-without", excluded));
}

Recovery recover(Comm& comm, const AgreeOptions& options) {
  const auto start = Clock::now();
  Comm::Impl& impl = impl_of(comm);
  revoke(comm, "recover() after a failed op");
  std::optional<Error> last;
  for (int attempt = 0; attempt < impl.config().size; ++attempt) {
    Agreement a = agree_on_failures(comm, options);
    try {
      auto child = shrink(comm, a);
      return {std::move(child), std::move(a), std::chrono::duration_cast<milliseconds>(Clock::now() - start)};
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kPeerFailure) throw;
      log::warning(e.what());
      last = e;
    }
  }
  throw *last;
}

namespace {

bool agree_all_unguarded(Comm& comm, bool ok, const AgreeOptions& options) {
  Comm::Impl& impl = impl_of(comm);
  need_elastic(impl, "agree_all");
  Store& store = *impl.config().store;
  const int size = impl.config().size;
  const std::string dir = str::cat(impl.config().rendezvous_ns, "/elastic/vote/", ++impl.elastic().votes);
  const std::string record = dir + "/decision";
  if (size == 1) return ok;
  // A "no" is recorded before this rank's vote shows: once every vote shows,
  // any "no" has already decided.
  if (!ok) store.compare_set(record, "", "0");
  store.set(str::cat(dir, "/", impl.config().rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str::cat(dir, "/", r));
  if (store.check(keys)) return store.compare_set(record, "", "1") == "1";
  Waiting wait = waiting(impl, options);
  std::set<int> present;
  return await_record(store, record, [&]() -> std::optional<std::string> {
           const auto missing = missing_ranks(store, dir, size, {}, present);
           if (missing.empty()) return "1";
           if (wait.give_up_on(missing)) return "0";
           return std::nullopt;
         }) == "1";
}

}  // namespace

bool agree_all(Comm& comm, bool ok, const AgreeOptions& options) {
  return through_store(impl_of(comm), "agree_all", [&] { return agree_all_unguarded(comm, ok, options); });
}

}  // namespace comms
