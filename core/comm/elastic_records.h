// The pieces every elastic decision is made of (elastic.cc's agreements,
// grow.cc's admissions): who is alive, waiting for a record that one
// participant writes once with compare_set, and which participants have
// shown up under a folder of keys.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/comm_impl.h"
#include "comms/elastic.h"
#include "comms/store.h"
#include "util/strutil.h"

namespace comms::internal {

using ElasticClock = std::chrono::steady_clock;

// AgreeOptions'/AdmitOptions' liveness timeout, else
// COMMS_ELASTIC_LIVENESS_TIMEOUT, else 1 s.
std::chrono::milliseconds liveness_timeout(const std::optional<std::chrono::milliseconds>& given);

// Which participants are gone: their process ended on this host (seen at
// once), or their heartbeat stood still for the liveness timeout since this
// process first looked (another host, or a stopped process). A process on
// this host that runs is alive, however late its heartbeat: on a loaded
// machine a watcher thread can miss its ticks for seconds.
class Liveness {
 public:
  // token_key(p): the store key holding participant p's process token.
  Liveness(Store& store, std::function<std::string(int)> token_key, std::chrono::milliseconds timeout)
      : store_(store), token_key_(std::move(token_key)), timeout_(timeout) {}
  bool dead(int participant);

 private:
  Store& store_;
  std::function<std::string(int)> token_key_;
  std::chrono::milliseconds timeout_;
  struct Process {
    std::string heartbeat;  // its counter's key ("": unknown)
    int pid = -1;           // on this host, else -1
  };
  std::map<int, std::pair<int64_t, ElasticClock::time_point>> seen_;
  std::map<int, Process> keys_;
};

struct Waiting {
  Liveness live;
  ElasticClock::time_point deadline;
  // Whether every participant in `missing` (never empty) is dead, or the
  // deadline passed.
  bool give_up_on(const std::vector<int>& missing);
};

// How long one wait for a decision record blocks before looking at who is
// missing: a server-side wait, so a decision wakes it at once.
inline constexpr std::chrono::milliseconds kDecisionPoll{50};

// Waits for `record`, which some participant writes once; `decide` is asked
// between waits and returns the value to propose once this one can decide
// (nullopt: keep waiting). Returns the record's value.
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

// As await_record, but asks `decide` before the first wait: for a record
// every participant waits on after showing up, the last to show up can
// write it at once instead of one poll later (the others are all waiting).
template <class Decide>
std::string decide_or_await_record(Store& store, const std::string& record, Decide&& decide) {
  if (auto proposal = decide()) return store.compare_set(record, "", *proposal);
  return await_record(store, record, decide);
}

// The participants of [0, size) (but `skip`) whose key "<dir>/<p>" is still
// missing; those found are remembered in `present`.
std::vector<int> missing_ranks(Store& store, const std::string& dir, int size, const std::set<int>& skip,
                               std::set<int>& present);

std::string encode_ranks(const std::vector<int>& ranks);  // "ranks:1,3"
std::vector<int> decode_ranks(const std::string& text);   // after the first ':'

inline Error elastic_error(const Comm::Impl& impl, ErrorCode code, const std::string& what, const char* op) {
  return impl.error(code, what, op);
}

// Agreements tell a dead rank from a slow one by the heartbeats, and a
// revocation reaches the other ranks through their watchers: both exist only
// for elastic comms (a planned shrink needs neither). Throws unless `impl`
// is elastic (or alone) and its store is there and answers.
void need_elastic(const Comm::Impl& impl, const char* op);

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

}  // namespace comms::internal
