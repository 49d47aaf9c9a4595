// The watched comms and the tick that heartbeats and spreads revocations
// (see elastic_watch.h). Store calls run without the registry's lock, so a
// comm being destroyed never waits for a slow store, only for a tick that
// is revoking it.
#include "comm/elastic_watch.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <mutex>
#include <set>
#include <vector>

#include "comm/comm_impl.h"
#include "trace/service.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::internal {

namespace {

constexpr const char* kRevocationsKey = "comms/elastic/revocations";
// A store that failed this many ticks in a row is given up (the job ends).
constexpr int kGiveUpAfter = 3;

struct Watched {
  std::shared_ptr<Store> store;
  std::string ns;
};

std::string heartbeat_key(const std::string& token) { return str::cat("comms/elastic/hb/", token); }

struct StoreState {
  int64_t revocations_seen = -1;
  int failures = 0;
};

// Stores given up on, with why: read by recover() and the agreements, which
// cannot work without the store (guarded by Registry::mu).
std::map<const Store*, std::string>& lost_stores() {
  static auto* m = new std::map<const Store*, std::string>;  // leaked, as the registry
  return *m;
}

struct Registry {
  std::mutex mu;       // guards comms and heartbeat_only
  std::mutex tick_mu;  // held while a tick revokes; unwatch waits for it
  std::map<Comm::Impl*, Watched> comms;
  // Stores heartbeated for a process with no comm on them yet (StoreHeartbeat), counted.
  std::map<Store*, std::pair<std::shared_ptr<Store>, int>> heartbeat_only;
  std::map<Store*, StoreState> stores;  // the tick's own (one thread)
};

Registry& registry() {
  static Registry* r = new Registry;  // leaked: the watcher may tick during exit
  return *r;
}

std::vector<std::string> revoked_among(Store& store, const std::vector<std::string>& namespaces) {
  std::vector<std::string> out;
  for (const auto& ns : namespaces) {
    if (store.check({revoked_key(ns)})) out.push_back(ns);
  }
  return out;
}

// Heartbeats, and reads the revocation counter; returns the namespaces of
// this store's comms that were revoked since the last look.
std::vector<std::string> tick_store(Store& store, StoreState& state, const std::vector<std::string>& namespaces) {
  store.add(heartbeat_key(process_token()), 1);
  const int64_t now = store.add(kRevocationsKey, 0);
  if (now == state.revocations_seen) return {};
  state.revocations_seen = now;
  return revoked_among(store, namespaces);
}

void revoke_revoked(Store* store, const std::vector<std::string>& revoked) {
  Registry& reg = registry();
  std::map<std::string, std::string> reasons;  // read before any lock: the store may be slow
  for (const auto& ns : revoked) {
    try {
      reasons[ns] = store->get(revoked_key(ns), std::chrono::seconds(1));
    } catch (const std::exception& e) {
      reasons[ns] = e.what();
    }
  }
  // Held while revoking, so that a comm being destroyed waits (unwatch_comm)
  // instead of vanishing under revoke_local.
  std::lock_guard<std::mutex> tick(reg.tick_mu);
  std::vector<std::pair<Comm::Impl*, std::string>> todo;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto& [impl, w] : reg.comms) {
      auto reason = reasons.find(w.ns);
      if (w.store.get() == store && reason != reasons.end() && !impl->is_revoked()) {
        todo.emplace_back(impl, reason->second);
      }
    }
  }
  for (auto& [impl, reason] : todo) impl->revoke_local(str::cat("revoked by another rank: ", reason));
}

// The store stopped answering: no agreement can run, so the elastic comms on
// it are revoked here, and their ops fail saying why instead of running on
// into a recovery that would wait for the store.
void give_up_on(Store* store, const std::string& why) {
  Registry& reg = registry();
  const std::string reason = str::cat("the job's store stopped answering (", why,
                                      "); elastic recovery cannot work without it");
  log::warning(str::cat("comms elastic: ", reason));
  std::lock_guard<std::mutex> tick(reg.tick_mu);
  std::vector<Comm::Impl*> todo;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    lost_stores()[store] = why;
    for (auto& [impl, w] : reg.comms) {
      if (w.store.get() == store && !impl->is_revoked()) todo.push_back(impl);
    }
  }
  for (auto* impl : todo) impl->revoke_local(reason);
}

void tick() {
  Registry& reg = registry();
  std::map<Store*, std::pair<std::shared_ptr<Store>, std::vector<std::string>>> stores;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto& [impl, w] : reg.comms) {
      auto& entry = stores[w.store.get()];
      entry.first = w.store;
      entry.second.push_back(w.ns);
    }
    for (auto& [raw, held] : reg.heartbeat_only) stores[raw].first = held.first;
  }
  std::erase_if(reg.stores, [&](const auto& kv) { return !stores.count(kv.first); });
  for (auto& [raw, entry] : stores) {
    StoreState& state = reg.stores[raw];
    if (state.failures >= kGiveUpAfter) continue;
    std::vector<std::string> revoked;
    try {
      revoked = tick_store(*entry.first, state, entry.second);
      state.failures = 0;
    } catch (const std::exception& e) {
      if (++state.failures == kGiveUpAfter) give_up_on(raw, e.what());
      continue;
    }
    if (!revoked.empty()) revoke_revoked(raw, revoked);
  }
}

}  // namespace

std::string revoked_key(const std::string& ns) { return str::cat(ns, "/elastic/revoked"); }

// Unique to this process, across hosts and pid reuse. Leaked: the watcher
// may tick while exit destroys static objects.
const std::string& process_token() {
  static const std::string* token = [] {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    std::random_device rd;
    return new std::string(str::cat(host, ":", ::getpid(), ":", str::hex((uint64_t(rd()) << 32) | rd())));
  }();
  return *token;
}

std::string process_key(const std::string& ns, int rank) { return str::cat(ns, "/elastic/process/", rank); }

// "host:pid:nonce" -> the pid when that process is on this host, else -1.
int local_pid(const std::string& token) {
  const size_t last = token.rfind(':');
  const size_t mid = last == std::string::npos || last == 0 ? std::string::npos : token.rfind(':', last - 1);
  if (mid == std::string::npos) return -1;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  if (token.compare(0, mid, host) != 0 || mid != std::strlen(host)) return -1;
  try {
    return std::stoi(token.substr(mid + 1, last - mid - 1));
  } catch (const std::exception&) {
    return -1;
  }
}

std::string heartbeat_key_at(Store& store, const std::string& token_key, std::chrono::milliseconds timeout,
                             int* pid) {
  const std::string token = store.get(token_key, timeout);
  *pid = local_pid(token);
  return heartbeat_key(token);
}

StoreHeartbeat::StoreHeartbeat(std::shared_ptr<Store> store) : store_(std::move(store)) {
  trace::start_watcher();  // a process with no comm yet has no watcher thread
  trace::set_tick_hook(&tick);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto& held = reg.heartbeat_only[store_.get()];
  held.first = store_;
  ++held.second;
}

StoreHeartbeat::~StoreHeartbeat() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.heartbeat_only.find(store_.get());
  if (it != reg.heartbeat_only.end() && --it->second.second == 0) reg.heartbeat_only.erase(it);
}

LocalState local_state(int pid) {
  std::ifstream stat(str::cat("/proc/", pid, "/stat"));
  if (!stat) return LocalState::kEnded;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');  // the command name may hold blanks
  if (paren == std::string::npos || paren + 2 >= line.size()) return LocalState::kRunning;
  switch (line[paren + 2]) {
    case 'Z':
    case 'X': return LocalState::kEnded;
    case 'T':
    case 't': return LocalState::kStopped;
    default: return LocalState::kRunning;
  }
}

std::optional<std::string> store_lost(const Store& store) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = lost_stores().find(&store);
  if (it == lost_stores().end()) return std::nullopt;
  return it->second;
}

void publish_revocation(Store& store, const std::string& ns, const std::string& reason) {
  store.set(revoked_key(ns), reason);
  store.add(kRevocationsKey, 1);
}

void watch_comm(Comm::Impl* impl, std::shared_ptr<Store> store, std::string ns, int rank) {
  try {
    store->set(process_key(ns, rank), process_token());
  } catch (const std::exception& e) {  // the comm's own rendezvous will say more
    log::warning(str::cat("comms elastic: cannot record this process for comm namespace '", ns, "': ", e.what()));
  }
  trace::set_tick_hook(&tick);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.comms[impl] = Watched{std::move(store), std::move(ns)};
}

void unwatch_comm(Comm::Impl* impl) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> tick(reg.tick_mu);
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.comms.erase(impl);
}

}  // namespace comms::internal
