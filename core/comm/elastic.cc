// comms/elastic.h: revoke, the agreement on the failed set, the shrink's
// commit, recover, and the per-step vote. Every decision is one record
// written once with compare_set, so every rank reads the same answer; the
// ranks only differ in when they stop waiting for it, and whoever stops
// first writes the record from what the store shows then.
#include "comms/elastic.h"

#include <algorithm>
#include <set>

#include "comm/comm_impl.h"
#include "comm/elastic_records.h"
#include "comm/elastic_watch.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

Comm::Impl& impl_of(const Comm& comm) { return internal::CommAccess::impl(comm); }

using internal::await_record;
using internal::decide_or_await_record;
using internal::decode_ranks;
using internal::elastic_error;
using internal::encode_ranks;
using internal::Liveness;
using internal::missing_ranks;
using internal::need_elastic;
using internal::through_store;
using internal::Waiting;

Waiting waiting(Comm::Impl& impl, const AgreeOptions& o) {
  const milliseconds timeout = o.timeout.value_or(impl.op_timeout());
  const std::string ns = impl.config().rendezvous_ns;
  return Waiting{Liveness(*impl.config().store, [ns](int rank) { return internal::process_key(ns, rank); },
                          internal::liveness_timeout(o.liveness_timeout)),
                 Clock::now() + timeout};
}

std::string agree_dir(const Comm::Impl& impl, int round) {
  return str::cat(impl.config().rendezvous_ns, "/elastic/agree/r", round);
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
    record = decide_or_await_record(store, dir + "/commit", [&]() -> std::optional<std::string> {
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
