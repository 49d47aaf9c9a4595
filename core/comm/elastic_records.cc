// elastic_records.h: liveness, and the folders of keys elastic decisions
// count.
#include "comm/elastic_records.h"

#include "comm/elastic_watch.h"
#include "config/env.h"
#include "util/strutil.h"

namespace comms::internal {

namespace {
constexpr std::chrono::milliseconds kDefaultLiveness{1000};
}  // namespace

std::chrono::milliseconds liveness_timeout(const std::optional<std::chrono::milliseconds>& given) {
  if (given) return *given;
  if (auto v = env::get_duration("COMMS_ELASTIC_LIVENESS_TIMEOUT")) return *v;
  return kDefaultLiveness;
}

void need_elastic(const Comm::Impl& impl, const char* op) {
  if (!impl.config().store) {
    throw elastic_error(impl, ErrorCode::kUnsupported, "elastic recovery needs the comm's store", op);
  }
  if (auto why = store_lost(*impl.config().store)) {
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

bool Liveness::dead(int participant) {
  auto key = keys_.find(participant);
  if (key == keys_.end()) {
    // Written when the participant's comm was created (or it took its
    // ticket); if it is not there, only the deadline can tell.
    Process p;
    try {
      p.heartbeat = heartbeat_key_at(store_, token_key_(participant), timeout_, &p.pid);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
    }
    key = keys_.emplace(participant, p).first;
  }
  if (key->second.pid >= 0) {
    const LocalState state = local_state(key->second.pid);
    if (state == LocalState::kEnded) return true;
    if (state == LocalState::kRunning) return false;
  }
  if (key->second.heartbeat.empty()) return false;
  const int64_t beat = store_.add(key->second.heartbeat, 0);
  const auto now = ElasticClock::now();
  auto [it, first] = seen_.try_emplace(participant, beat, now);
  if (first || it->second.first != beat) {
    it->second = {beat, now};
    return false;
  }
  return now - it->second.second >= timeout_;
}

bool Waiting::give_up_on(const std::vector<int>& missing) {
  if (ElasticClock::now() >= deadline) return true;
  bool all_dead = true;
  for (int p : missing) all_dead = live.dead(p) && all_dead;  // look at each: it starts their clocks
  return all_dead;
}

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

}  // namespace comms::internal
