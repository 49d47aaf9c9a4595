// comms/elastic.h's growing half: join() and admit().
//
// Store keys, under the queue "comms/elastic/join/<first name>" that every
// epoch of a comm shares:
//   tickets              counter: a newcomer's add(1) gives its ticket t
//   ticket/<t>           its process token (liveness, as a rank's)
//   ticket/<t>/offer     written once: the grown comm's configuration from
//                        the leader, "withdrawn" by a newcomer that gave up,
//                        or "dropped" by a leader that found no process there
//   handled              tickets taken or dropped so far (a fresh comm's
//                        leader reads it once; derived comms inherit it)
//   closed               set by close_admissions(): the job takes no one
//                        any more
// and, per admit call, under "<comm namespace>/elastic/admit/c<call>":
//   decision             the leader's: "h<handled>[ t<ticket>,...]", or
//                        "fail" from a member that found the leader lost
//   a<attempt>/native/<type>, a<attempt>/voted/<rank>, a<attempt>/way
//                        which device types every participant builds
//                        natively (plugin ABI 2.7): one counter per type,
//                        then the record "native:<types>" or the lost
//                        participants
//   a<attempt>/present/<rank>, a<attempt>/failed, a<attempt>/commit
//                        the grown comm's confirmation, as shrink's
// Every record is written once with compare_set: one answer everywhere.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "comm/comm_impl.h"
#include "comm/elastic_records.h"
#include "comm/elastic_watch.h"
#include "bootstrap/local_placement.h"
#include "comms/bootstrap.h"
#include "config/env.h"
#include "store/store_tcp.h"
#include "util/json_text.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using nlohmann::json;
using internal::await_record;
using internal::decide_or_await_record;
using internal::Liveness;
using internal::Waiting;

constexpr auto kDefaultJoinTimeout = std::chrono::minutes(5);
constexpr const char* kWithdrawn = "withdrawn";
constexpr const char* kDropped = "dropped";
constexpr const char* kLeaderLost = "fail";

std::string queue_of(const std::string& name) {
  return str::cat("comms/elastic/join/", internal::base_comm_name(name));
}
std::string ticket_key(const std::string& queue, int64_t t) { return str::cat(queue, "/ticket/", t); }
std::string offer_key(const std::string& queue, int64_t t) { return str::cat(ticket_key(queue, t), "/offer"); }
std::string closed_key(const std::string& queue) { return queue + "/closed"; }
// How often a waiting newcomer looks whether the job closed its admissions.
constexpr milliseconds kClosedPoll{200};

struct Decision {
  int64_t handled = 0;         // tickets below this are taken or dropped
  std::vector<int64_t> taken;  // admitted now, in ticket order
};

std::string encode(const Decision& d) {
  return d.taken.empty() ? str::cat("h", d.handled) : str::cat("h", d.handled, " t", str::join(d.taken, ","));
}

Decision decode(const std::string& text) {
  Decision d;
  const size_t space = text.find(' ');
  d.handled = std::stoll(text.substr(1, space == std::string::npos ? std::string::npos : space - 1));
  if (space == std::string::npos) return d;
  for (std::string_view t : str::split(std::string_view(text).substr(space + 2), ',', true)) {
    d.taken.push_back(std::stoll(std::string(t)));
  }
  return d;
}

// One admit call, as every participant (member or newcomer) sees it.
struct Admission {
  std::shared_ptr<Store> store;
  std::string queue;
  std::string parent_ns;
  std::string dir;      // "<parent namespace>/elastic/admit/c<call>"
  int members = 0;      // the parent's size: newcomers' ranks start there
  uint64_t epoch = 0;   // the grown comm's
  uint64_t call = 0;
  milliseconds timeout{0};
  milliseconds liveness{0};
  milliseconds init_timeout{0};
};

// Rank 0 of the parent, whose decision everyone waits for.
std::string await_decision(const Admission& ad) {
  Waiting wait{Liveness(*ad.store, [&](int r) { return internal::process_key(ad.parent_ns, r); }, ad.liveness),
               Clock::now() + ad.timeout};
  return await_record(*ad.store, ad.dir + "/decision", [&]() -> std::optional<std::string> {
    if (wait.give_up_on({0})) return kLeaderLost;
    return std::nullopt;
  });
}

constexpr std::string_view kNative = "native:";

// Which device types every participant of an attempt builds natively (a
// native grow is collective: all participants or none). Each adds itself to
// the counter of every type it can grow natively (`mine`), then marks
// itself voted; once all voted, a type is native when its counter is the
// size. Returns the record, the same everywhere: "native:<types>", or the
// participants lost before voting (encode_ranks).
std::string agree_on_native(const Admission& ad, const std::string& dir, int size, int rank, uint32_t mine,
                            const std::function<std::string(int)>& token_key) {
  Store& store = *ad.store;
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    if (mine & (1u << i)) store.add(str::cat(dir, "/native/", i), 1);
  }
  store.set(str::cat(dir, "/voted/", rank), "1");
  Waiting wait{Liveness(store, token_key, ad.liveness), Clock::now() + ad.timeout};
  std::set<int> voted;
  return decide_or_await_record(store, dir + "/way", [&]() -> std::optional<std::string> {
    const auto missing = internal::missing_ranks(store, dir + "/voted", size, {}, voted);
    if (missing.empty()) {
      uint32_t all = 0;
      for (int i = 0; i < kNumDeviceTypes; ++i) {
        if (store.add(str::cat(dir, "/native/", i), 0) == size) all |= 1u << i;
      }
      return str::cat(kNative, all);
    }
    if (wait.give_up_on(missing)) return internal::encode_ranks(missing);
    return std::nullopt;
  });
}

// Builds the grown comm with the participants of `taken`, confirms it
// through the store, and retries without newcomers that were lost. Returns
// the grown comm, or null when no newcomer is left (on a member). `build`
// makes this participant's comm: (size, rank, namespace suffix, the device
// types to grow natively); `native` says which types this participant can.
// `fail` makes this participant's error.
using Build = std::function<std::shared_ptr<Comm::Impl>(int size, int rank, const std::string& ns_suffix,
                                                        uint32_t native)>;
using Fail = std::function<Error(ErrorCode code, const std::string& what)>;

std::shared_ptr<Comm> build_and_confirm(const Admission& ad, std::vector<int64_t> taken, int member_rank,
                                        int64_t ticket, uint32_t native, const Build& build, const Fail& fail) {
  Store& store = *ad.store;
  for (int attempt = 0; !taken.empty(); ++attempt) {
    const int size = ad.members + static_cast<int>(taken.size());
    int rank = member_rank;
    if (rank < 0) {
      auto mine = std::find(taken.begin(), taken.end(), ticket);
      if (mine == taken.end()) {
        throw fail(ErrorCode::kPeerFailure, "join: the members dropped this newcomer from the admission as lost");
      }
      rank = ad.members + static_cast<int>(mine - taken.begin());
    }
    const std::string dir = str::cat(ad.dir, "/a", attempt);
    const auto token_key = [&, taken](int r) {
      return r < ad.members ? internal::process_key(ad.parent_ns, r) : ticket_key(ad.queue, taken[r - ad.members]);
    };
    // Lost before voting: handled below as lost before confirming.
    std::string commit = agree_on_native(ad, dir, size, rank, native, token_key);
    std::shared_ptr<Comm::Impl> child;
    if (commit.starts_with(kNative)) {
      const auto types = static_cast<uint32_t>(std::stoul(commit.substr(kNative.size())));
      std::string failure;
      try {
        child = build(size, rank, str::cat("/elastic/grow-e", ad.epoch, "-c", ad.call, "-a", attempt), types);
      } catch (const Error& e) {
        failure = e.what();
      }
      // "failed" goes first: once every participant is present, it is final.
      if (!child) store.compare_set(dir + "/failed", "", str::cat("rank ", rank, ": ", failure));
      store.set(str::cat(dir, "/present/", rank), "1");
      // A participant may still be connecting (up to the init timeout) while
      // a lost one holds everyone's connect back.
      Waiting wait{Liveness(store, token_key, ad.liveness), Clock::now() + ad.timeout + ad.init_timeout};
      std::set<int> present;
      commit = decide_or_await_record(store, dir + "/commit", [&]() -> std::optional<std::string> {
        const auto missing = internal::missing_ranks(store, dir + "/present", size, {}, present);
        if (missing.empty()) return store.check({dir + "/failed"}) ? "failed" : "ok";
        if (wait.give_up_on(missing)) return internal::encode_ranks(missing);
        return std::nullopt;
      });
    }
    if (commit == "ok") {
      if (child) return std::make_shared<Comm>(child);
      throw fail(ErrorCode::kInternal, "admit: confirmed a grown comm this participant did not build");
    }
    if (child) child->abort("the admission did not complete");
    child.reset();
    if (commit == "failed") {
      throw fail(ErrorCode::kInternal,
                 str::cat("admit: building the grown comm of epoch ", ad.epoch, " failed (",
                          store.get(dir + "/failed", ad.timeout), "); the comm stays as it was"));
    }
    const std::vector<int> lost = internal::decode_ranks(commit);
    if (lost.front() < ad.members) {
      std::vector<int> members;
      for (int r : lost) {
        if (r < ad.members) members.push_back(r);
      }
      throw fail(ErrorCode::kPeerFailure,
                 str::cat("admit: member rank(s) [", str::join(members, ","),
                          "] were lost during the admission (the members' recover() shrinks their comm)"));
    }
    if (std::binary_search(lost.begin(), lost.end(), rank)) {
      throw fail(ErrorCode::kPeerFailure, "join: the others found this newcomer lost during its admission");
    }
    std::vector<int64_t> left;
    for (size_t i = 0; i < taken.size(); ++i) {
      if (!std::binary_search(lost.begin(), lost.end(), ad.members + static_cast<int>(i))) left.push_back(taken[i]);
    }
    log::warning(str::cat("comms admit: newcomer rank(s) [", str::join(lost, ","), "] of epoch ", ad.epoch,
                          " were lost while being admitted; admitting the others (", left.size(), ")"));
    taken = std::move(left);
  }
  return nullptr;
}

// The grown comm's configuration that the leader offers the newcomers.
std::string offer_text(const Comm::Impl& impl, const Admission& ad) {
  const auto& c = impl.config();
  json j;
  j["parent_ns"] = c.rendezvous_ns;
  j["parent_name"] = c.name;
  j["members"] = c.size;
  j["epoch"] = ad.epoch;
  j["call"] = ad.call;
  j["backend"] = c.spec.to_string();
  j["device"] = c.bound_device ? json(c.bound_device->to_string()) : json(nullptr);
  j["init_timeout_ms"] = c.init_timeout.count();
  j["op_timeout_ms"] = impl.op_timeout().count();
  j["hints"] = json::object();
  for (const auto& [k, v] : impl.hints()) j["hints"][k] = v;
  j["abort_process_on_error"] = c.abort_process_on_error;
  j["elastic"] = c.elastic;
  j["timeout_ms"] = ad.timeout.count();
  j["liveness_ms"] = ad.liveness.count();
  return json_text(j);
}

// The leader takes the waiting tickets in order: one whose process ended
// here is dropped, one that withdrew (timed out) too. The last ticket, when
// its newcomer has not yet recorded its process, is left to the next admit;
// one that others wait behind gets the liveness timeout to appear (its
// newcomer may have died between taking it and recording itself).
Decision decide(Comm::Impl& impl, const Admission& ad) {
  Store& store = *ad.store;
  const int64_t tickets = store.add(ad.queue + "/tickets", 0);
  Decision d;
  d.handled = impl.elastic().tickets_handled;
  if (d.handled < 0) {
    d.handled = store.check({ad.queue + "/handled"}) ? std::stoll(store.get(ad.queue + "/handled", ad.timeout)) : 0;
  }
  if (tickets <= d.handled) return d;
  const int64_t before = d.handled;
  const std::string offer = offer_text(impl, ad);
  for (int64_t t = d.handled; t < tickets; ++t) {
    if (!store.check({ticket_key(ad.queue, t)})) {
      if (t + 1 == tickets) break;
      try {
        store.get(ticket_key(ad.queue, t), ad.liveness);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kTimeout) throw;
        if (store.compare_set(offer_key(ad.queue, t), "", kDropped) == kDropped) {
          d.handled = t + 1;
          continue;
        }
      }
    }
    d.handled = t + 1;
    const int pid = internal::local_pid(store.get(ticket_key(ad.queue, t), ad.timeout));
    if (pid >= 0 && internal::local_state(pid) == internal::LocalState::kEnded) continue;
    if (store.compare_set(offer_key(ad.queue, t), "", offer) != offer) continue;  // withdrawn
    d.taken.push_back(t);
  }
  if (d.handled != before) store.set(ad.queue + "/handled", std::to_string(d.handled));
  return d;
}

std::shared_ptr<Comm> admit_unguarded(const std::shared_ptr<Comm>& comm, const AdmitOptions& options) {
  Comm::Impl& impl = internal::CommAccess::impl(*comm);
  internal::need_elastic(impl, "admit");
  if (impl.is_revoked()) {
    throw impl.error(ErrorCode::kRevoked, "admit: the comm is revoked; recover() it first", "admit");
  }
  Admission ad;
  ad.store = impl.config().store;
  ad.queue = queue_of(impl.config().name);
  ad.parent_ns = impl.config().rendezvous_ns;
  ad.call = ++impl.elastic().admits;
  ad.dir = str::cat(ad.parent_ns, "/elastic/admit/c", ad.call);
  ad.members = impl.config().size;
  ad.epoch = impl.config().epoch + 1;
  ad.timeout = options.timeout.value_or(impl.op_timeout());
  ad.liveness = internal::liveness_timeout(options.liveness_timeout);
  ad.init_timeout = impl.config().init_timeout;
  const auto fail = [&](ErrorCode code, const std::string& what) { return impl.error(code, what, "admit"); };
  std::string record;
  if (impl.config().rank == 0) {
    const std::string mine = encode(decide(impl, ad));
    record = ad.store->compare_set(ad.dir + "/decision", "", mine);
  } else {
    record = await_decision(ad);
  }
  if (record == kLeaderLost) {
    throw fail(ErrorCode::kPeerFailure, "admit: rank 0, which decides, was lost before deciding; recover() the comm");
  }
  const Decision d = decode(record);
  impl.elastic().tickets_handled = d.handled;
  if (d.taken.empty()) return comm;
  const Build build = [&](int size, int rank, const std::string& suffix, uint32_t native) {
    return Comm::Impl::make_derived(impl.derived_config(size, rank, ad.epoch, suffix, ""), d.handled,
                                    [&](Comm::Impl& child) { child.grow_backends(&impl, ad.members, native); });
  };
  const uint32_t native = Comm::Impl::native_grow_types(&impl, impl.config().spec);
  auto grown = build_and_confirm(ad, d.taken, impl.config().rank, -1, native, build, fail);
  return grown ? grown : comm;
}

}  // namespace

std::shared_ptr<Comm> admit(const std::shared_ptr<Comm>& comm, const AdmitOptions& options) {
  if (!comm) throw Error(ErrorCode::kInvalidArgument, "admit: no comm given");
  return internal::through_store(internal::CommAccess::impl(*comm), "admit",
                                 [&] { return admit_unguarded(comm, options); });
}

void close_admissions(const Comm& comm) {
  const Comm::Impl& impl = internal::CommAccess::impl(comm);
  internal::need_elastic(impl, "close_admissions");
  internal::through_store(impl, "close_admissions",
                          [&] { impl.config().store->set(closed_key(queue_of(impl.config().name)), "1"); });
}

namespace {

Comm::Impl::Config offered_config(const json& offer, const std::shared_ptr<Store>& store) {
  Comm::Impl::Config c;
  c.spec = BackendSpec::parse(offer.at("backend").get<std::string>());
  if (!offer.at("device").is_null()) c.bound_device = Device::parse(offer.at("device").get<std::string>());
  c.init_timeout = milliseconds(offer.at("init_timeout_ms").get<int64_t>());
  c.op_timeout = milliseconds(offer.at("op_timeout_ms").get<int64_t>());
  for (const auto& [k, v] : offer.at("hints").items()) c.hints[k] = v.get<std::string>();
  c.abort_process_on_error = offer.at("abort_process_on_error").get<bool>();
  c.elastic = offer.at("elastic").get<bool>();
  c.store = store;
  c.store_local_address = tcp_store_local_address(*store);
  c.epoch = offer.at("epoch").get<uint64_t>();
  c.name = str::cat(internal::base_comm_name(offer.at("parent_name").get<std::string>()), "@e", c.epoch);
  return c;
}

// One ticket's way: waits up to `wait` for an offer, then takes part in
// that admission.
std::shared_ptr<Comm> join_once(const std::shared_ptr<Store>& store, const std::string& name, milliseconds wait,
                                milliseconds timeout, const Fail& fail, int64_t* ticket) {
  const std::string queue = queue_of(name);
  const auto closed = [&] {
    return fail(ErrorCode::kAborted, str::cat("join: '", name,
                                              "' closed its admissions (close_admissions: the job has finished)"));
  };
  if (store->check({closed_key(queue)})) throw closed();
  *ticket = store->add(queue + "/tickets", 1) - 1;
  store->set(ticket_key(queue, *ticket), internal::process_token());
  std::string offer;
  const auto deadline = Clock::now() + wait;
  while (offer.empty()) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    try {
      offer = store->get(offer_key(queue, *ticket), std::clamp(left, milliseconds(1), kClosedPoll));
      break;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
    }
    const bool is_closed = store->check({closed_key(queue)});
    if (!is_closed && Clock::now() < deadline) continue;
    offer = store->compare_set(offer_key(queue, *ticket), "", kWithdrawn);  // unless an offer just came
    if (offer != kWithdrawn) break;
    if (is_closed) throw closed();
    throw fail(ErrorCode::kTimeout, str::cat("join: no member of '", name, "' admitted this process within ",
                                             timeout.count(), " ms"));
  }
  if (offer == kDropped) {
    throw fail(ErrorCode::kPeerFailure, "join: the members dropped this ticket: this process recorded itself "
                                        "too late after taking it");
  }
  const json j = json::parse(offer);
  Admission ad;
  ad.store = store;
  ad.queue = queue;
  ad.parent_ns = j.at("parent_ns").get<std::string>();
  ad.call = j.at("call").get<uint64_t>();
  ad.dir = str::cat(ad.parent_ns, "/elastic/admit/c", ad.call);
  ad.members = j.at("members").get<int>();
  ad.epoch = j.at("epoch").get<uint64_t>();
  ad.timeout = milliseconds(j.at("timeout_ms").get<int64_t>());
  ad.liveness = milliseconds(j.at("liveness_ms").get<int64_t>());
  ad.init_timeout = milliseconds(j.at("init_timeout_ms").get<int64_t>());
  const Comm::Impl::Config offered = offered_config(j, store);
  const std::string record = await_decision(ad);
  if (record == kLeaderLost) {
    throw fail(ErrorCode::kPeerFailure, "join: the members lost their rank 0 before admitting this newcomer");
  }
  const Decision d = decode(record);
  const Build build = [&](int size, int rank, const std::string& suffix, uint32_t native) {
    Comm::Impl::Config c = offered;
    c.rank = rank;
    c.size = size;
    // Where this process sits on its host (LOCAL_RANK and the like: a
    // replacement started by a launcher has them, but no RANK).
    const auto placement = internal::local_placement_from_environment(rank, size);
    c.local_rank = placement.local_rank;
    c.local_size = placement.local_size;
    c.rendezvous_ns = ad.parent_ns + suffix;
    return Comm::Impl::make_derived(c, d.handled,
                                    [&](Comm::Impl& child) { child.grow_backends(nullptr, ad.members, native); });
  };
  const uint32_t native = Comm::Impl::native_grow_types(nullptr, offered.spec);
  auto grown = build_and_confirm(ad, d.taken, -1, *ticket, native, build, fail);
  if (!grown) throw fail(ErrorCode::kPeerFailure, "join: the members dropped this newcomer from the admission");
  return grown;
}

// An admission that failed on the members' side (a member lost during it,
// their leader lost, or this process dropped as lost) ends with the members
// going on (after a loss, recover() shrinks them) and admitting again at
// their next step: so the newcomer takes a new ticket, until its timeout.
std::shared_ptr<Comm> join_unguarded(const std::string& name, const JoinOptions& options, const Fail& fail,
                                     int64_t* ticket) {
  const milliseconds timeout =
      options.timeout ? *options.timeout : env::get_duration("COMMS_INIT_TIMEOUT").value_or(kDefaultJoinTimeout);
  if (timeout.count() <= 0) throw fail(ErrorCode::kInvalidArgument, str::cat("join: timeout must be positive"));
  // Rank -1 of no world: never the host of a MASTER_ADDR store.
  std::shared_ptr<Store> store = options.store ? options.store : default_store(-1, 0, timeout);
  internal::StoreHeartbeat heartbeat(store);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    try {
      return join_once(store, name, std::max(left, milliseconds(1)), timeout, fail, ticket);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kPeerFailure || Clock::now() >= deadline) throw;
      log::warning(str::cat(e.what(), "; joining again"));
    }
  }
}

}  // namespace

uint32_t Comm::Impl::native_grow_types(const Impl* parent, const BackendSpec& spec) {
  uint32_t types = 0;
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!spec.has(t)) continue;
    const internal::LoadedPlugin* plugin = nullptr;
    if (parent) {
      const DeviceBackend& s = parent->device_backend(t);
      const BackendState state = s.state.load();
      if (!s.backend || (state != BackendState::kReady && state != BackendState::kLazy)) continue;
      plugin = s.plugin;
    } else {
      try {
        plugin = &internal::PluginRegistry::instance().get(spec.backend_for(t));
      } catch (const Error&) {
        continue;  // creating it fails later, saying why
      }
    }
    if (plugin && plugin::abi_minor(plugin->descriptor->abi_version) >= 7 && plugin->descriptor->join_grown) {
      types |= 1u << i;
    }
  }
  return types;
}

void Comm::Impl::grow_backends(Impl* parent, int members, uint32_t native) {
  const char* op = parent ? "admit" : "join";
  auto routed = internal::route_hints(config_.hints, config_.spec, config_.name);
  for (int i = 0; i < kNumDeviceTypes; ++i) {
    const auto t = static_cast<DeviceType>(i);
    if (!config_.spec.has(t)) continue;
    DeviceBackend& s = device_backend(t);
    if ((native & (1u << i)) == 0) {
      create_backend(t, routed[i]);
      s.grown = "recreate";
      continue;
    }
    place_backend(t, routed[i]);
    if (parent) s.plugin = parent->device_backend(t).plugin;  // the one whose grow() runs
    plugin::GrowDesc desc;
    desc.members = members;
    desc.child = init_for(t);
    std::unique_ptr<plugin::Backend> made;
    const char* function = parent ? "grow" : "join_grown";
    const Status st = internal::call_plugin(
        s.plugin->name, function,
        [&] {
          return parent ? parent->device_backend(t).backend->grow(desc, &made)
                        : s.plugin->descriptor->join_grown(desc, &made);
        },
        made, "backend");
    if (st.code == ErrorCode::kUnsupported) {  // declined on every participant: nothing was made
      create_backend(t, routed[i]);
      s.grown = "recreate";
      continue;
    }
    if (!st.is_ok()) {
      throw error(st.code, str::cat(op, ": growing the ", s.plugin->name, " backend for ", to_string(t), " (",
                                    function, "): ", st.message),
                  op);
    }
    s.backend = std::move(made);
    s.state = BackendState::kReady;
    s.grown = "native";
  }
  connect_bound_backend();
}

std::shared_ptr<Comm> join(const std::string& name, const JoinOptions& options) {
  int64_t ticket = -1;
  const Fail fail = [&](ErrorCode code, const std::string& what) {
    return Error(code, str::cat("comms[join '", name, "' ticket ", ticket, "] ", what), name, "join", 0, -1);
  };
  if (name.empty()) throw fail(ErrorCode::kInvalidArgument, "join: the name of the comm to join is empty");
  try {
    return join_unguarded(name, options, fail, &ticket);
  } catch (const Error& e) {
    if (!e.comm().empty()) throw;
    throw fail(e.code(), str::cat("join: ", e.what()));
  } catch (const json::exception& e) {
    throw fail(ErrorCode::kInternal, str::cat("join: unreadable offer from the members: ", e.what()));
  }
}

}  // namespace comms
