#include "comms/dist.h"

#include <algorithm>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "comm/backend_select.h"
#include "comm/comm_impl.h"
#include "dist_state.h"
#include "config/env.h"
#include "util/json_text.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

// Every failure here is about creating a group: the error names the group as
// its comm, "new_group" as its op (no sequence number) and the world rank.
[[noreturn]] void fail(ErrorCode code, const std::string& group, const std::string& why) {
  const int rank = is_initialized() ? world().rank() : -1;
  throw Error(code, str::cat("comms::dist group '", group, "': ", why), group, "new_group", 0, rank);
}

// A typed option as its hint. The same setting also given as a raw hint in
// BackendOptions::hints is an error, not a silent override.
void put(Hints& h, const std::string& key, const std::string& value) {
  if (auto it = h.find(key); it != h.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("'", key, "' is given both as a typed option (", value, ") and as a hint (", it->second,
                         "); give it once"));
  }
  h[key] = value;
}

std::string qualified_filter(const BackendSpec& parent, const std::string& requested,
                             const std::string& group) {
  // new_group speaks c10d: "gloo" or "cpu:gloo". The split route needs a
  // device-qualified string that includes the parent's default device
  // backend, so build exactly that from the request.
  try {
    return internal::select_backends(parent, requested, internal::FilterAdvice::kCreateWorld).to_string();
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, group, e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------

std::string_view to_string(Route r) { return r == Route::kSplit ? "split" : "direct"; }

Route route_from_environment() {
  return env::get_choice("COMMS_ROUTE", "direct", {"direct", "split"}, "a route") == "split" ? Route::kSplit
                                                                                          : Route::kDirect;
}

Hints to_hints(const BackendOptions& o) {
  Hints h = o.hints;
  for (const OptionSpelling& row : kOptionSpellings) {
    const std::optional<OptionValue> v = row.get(o);
    if (!v) continue;
    std::string text;
    if (const bool* b = std::get_if<bool>(&*v)) text = *b ? "1" : "0";
    else if (const int* i = std::get_if<int>(&*v)) text = std::to_string(*i);
    else text = std::get<std::string>(*v);
    put(h, std::string(row.hint), text);
  }
  return h;
}

// ---------------------------------------------------------------------------
// Group

Group::operator bool() const { return state_ && state_->comm && !state_->destroyed; }

namespace {
const GroupState& member_state(const std::shared_ptr<GroupState>& s) {
  if (!s) throw Error(ErrorCode::kInvalidArgument, "comms::dist: this Group handle is empty (not a member)");
  if (s->destroyed) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("comms::dist group '", s->spec.name, "' was destroyed"));
  }
  if (!s->comm) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("comms::dist group '", s->spec.name, "': this rank is not a member"));
  }
  return *s;
}
}  // namespace

int Group::rank() const { return member_state(state_).comm->rank(); }
int Group::size() const { return member_state(state_).comm->size(); }
const std::vector<int>& Group::global_ranks() const { return member_state(state_).spec.ranks; }
std::string Group::backend() const { return member_state(state_).comm->backend_string(); }
std::optional<Device> Group::device() const { return member_state(state_).comm->device(); }
Route Group::route() const { return member_state(state_).spec.route; }
const std::string& Group::name() const { return member_state(state_).spec.name; }
const GroupSpec& Group::spec() const { return member_state(state_).spec; }
Comm& Group::comm() const { return *member_state(state_).comm; }
std::shared_ptr<Comm> Group::shared_comm() const { return member_state(state_).comm; }

std::string Group::describe() const {
  const auto& s = member_state(state_);
  nlohmann::json j;
  j["name"] = s.spec.name;
  j["route"] = std::string(to_string(s.spec.route));
  j["parent"] = s.spec.parent;
  j["global_ranks"] = s.spec.ranks;
  j["description"] = s.spec.description;
  j["comm"] = nlohmann::json::parse(s.comm->describe());
  return json_text(j, 2);
}

// ---------------------------------------------------------------------------

Registry& registry() {
  static auto* r = new Registry();  // lives until exit, like c10d's default group state
  return *r;
}

bool is_initialized() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.world && !reg.world->destroyed;
}

Group world() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  if (!reg.world || reg.world->destroyed) {
    throw Error(ErrorCode::kInvalidArgument, "comms::dist: call init_process_group() first");
  }
  return Group(reg.world);
}

std::vector<Group> groups() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<Group> out;
  for (const auto& g : reg.groups) out.emplace_back(g);
  return out;
}

Group init_process_group(const InitOptions& options) {
  auto& reg = registry();
  if (is_initialized()) {
    throw Error(ErrorCode::kInvalidArgument,
                "comms::dist: init_process_group() was already called; destroy_process_group() first");
  }
  const Route route = route_from_environment();
  // Empty: new_comm reads (and checks) COMMS_BACKEND itself.
  std::string backend = options.backend;
  const std::string requested = backend.empty() ? env::get("COMMS_BACKEND").value_or("") : backend;
  if (options.device && str::lower(str::strip(requested)) == "nccl") {
    backend = "cpu:gloo,cuda:nccl";  // so CPU subgroups can be made later
  }
  CommOptions co;
  co.op_timeout = options.timeout;
  co.hints = to_hints(options.options);
  co.store = options.store;
  co.rank = options.rank;
  co.world_size = options.world_size;
  co.elastic = options.elastic;
  auto comm = new_comm(backend, options.device, "world", co);

  auto state = std::make_shared<GroupState>();
  state->comm = comm;
  state->spec.name = "world";
  state->spec.description = "the world group";
  state->spec.ranks.resize(static_cast<size_t>(comm->size()));
  for (int r = 0; r < comm->size(); ++r) state->spec.ranks[static_cast<size_t>(r)] = r;
  state->spec.backend = comm->backend_string();
  state->spec.timeout = comm->op_timeout();
  state->spec.options = options.options;
  state->spec.hints = co.hints;
  state->spec.route = route;
  state->device = options.device;
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.route = route;
  state->library_owned = reg.sessions > 0;
  state->spec.creation_index = reg.next_index++;
  reg.world = state;
  reg.groups = {state};
  reg.next_name = 0;
  reg.collections = 0;
  log::info(str::cat("comms::dist: world of ", comm->size(), " ranks, backend ", comm->backend_string(),
                     ", route ", to_string(route)));
  return Group(state);
}

// Creates (or recreates, for reload and recovery) the communicator of a
// group spec on this rank. Collective over the members (direct) or the
// parent (split).
std::shared_ptr<Comm> create_group_comm(const GroupSpec& spec, const GroupState& parent, int member_rank,
                                        const std::string& comm_name) {
  const std::string& name = comm_name.empty() ? spec.name : comm_name;
  const Comm& parent_comm = *parent.comm;
  auto& pimpl = internal::CommAccess::impl(parent_comm);
  if (spec.route == Route::kDirect) {
    if (member_rank < 0) return nullptr;
    CommOptions co;
    co.rank = member_rank;
    co.world_size = static_cast<int>(spec.ranks.size());
    co.store = pimpl.config().store;
    co.init_timeout = parent_comm.init_timeout();
    co.op_timeout = spec.timeout;
    co.hints = spec.hints;
    co.abort_process_on_error = parent_comm.abort_process_on_error();
    co.elastic = parent_comm.elastic();
    std::optional<Device> device;
    const BackendSpec b = BackendSpec::parse(spec.backend);
    if (parent.device && b.has(parent.device->type)) device = parent.device;
    return new_comm(spec.backend, device, name, co);
  }
  SplitOptions so;
  so.op_timeout = spec.timeout;
  so.hints = spec.hints;
  so.backend = spec.backend;
  std::vector<int> parent_ranks;
  if (member_rank >= 0) {
    for (int g : spec.ranks) {
      auto it = std::find(parent.spec.ranks.begin(), parent.spec.ranks.end(), g);
      parent_ranks.push_back(static_cast<int>(it - parent.spec.ranks.begin()));
    }
  }
  return const_cast<Comm&>(parent_comm).split(parent_ranks, name, so);
}

namespace {

void check_split_rules(const GroupState& parent, const std::string& name) {
  if (!parent.comm->device()) {
    fail(ErrorCode::kInvalidArgument, name,
         str::cat("COMMS_ROUTE=split carves groups from the parent with Comm::split, which needs the "
                  "parent ('", parent.spec.name, "') bound to a device: pass a device to "
                  "init_process_group (Device::cuda(local_rank), or Device::cpu() in a CPU-only job)"));
  }
}

// The group's hints checked against its backends on every rank, members or
// not: otherwise a hint the group cannot take (an nccl key on a cpu:gloo
// group) throws on the members only, and the others carry on with null.
void check_hints_on_every_rank(const GroupSpec& spec) {
  try {
    (void)internal::route_hints(spec.hints, BackendSpec::parse(spec.backend), spec.name);
  } catch (const Error& e) {
    fail(e.code(), spec.name, e.what());
  }
}

std::shared_ptr<GroupState> register_group(GroupSpec spec, std::shared_ptr<Comm> comm) {
  auto& reg = registry();
  auto state = std::make_shared<GroupState>();
  state->spec = std::move(spec);
  state->comm = std::move(comm);
  if (state->comm) state->device = state->comm->device();
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    state->library_owned = reg.sessions > 0;
    reg.groups.push_back(state);
  }
  if (state->comm && log::enabled(log::Level::kInfo)) {
    log::info(str::cat("comms::dist: created group: ", Group(state).describe()));
  }
  return state;
}

}  // namespace

Group new_group(std::span<const int> ranks, const GroupOptions& options) {
  Group w = world();
  std::string name;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    name = options.name.empty() ? str::cat("pg", ++reg.next_name) : options.name;
  }
  GroupOptions named = options;
  named.name = name;
  auto state = create_group(ranks, named);
  return state->comm ? Group(state) : Group();
}

std::shared_ptr<GroupState> create_group(std::span<const int> ranks, const GroupOptions& options,
                                         const std::string& comm_name) {
  Group w = world();
  const GroupState& parent = *w.state();
  auto& reg = registry();
  const std::string& name = options.name;
  if (ranks.empty()) fail(ErrorCode::kInvalidArgument, name, "a group needs at least one rank");
  std::set<int> seen;
  int member_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= w.size()) {
      fail(ErrorCode::kInvalidArgument, name,
           str::cat("rank ", ranks[i], " is outside the world (size ", w.size(), ")"));
    }
    if (!seen.insert(ranks[i]).second) {
      fail(ErrorCode::kInvalidArgument, name, str::cat("rank ", ranks[i], " is listed twice"));
    }
    if (ranks[i] == w.rank()) member_rank = static_cast<int>(i);
  }

  GroupSpec spec;
  spec.name = name;
  spec.description = options.description;
  spec.ranks.assign(ranks.begin(), ranks.end());
  spec.timeout = options.timeout.value_or(parent.comm->op_timeout());
  spec.options = options.options;
  // Groups inherit the world's options; the group's own win per key.
  spec.hints = parent.spec.hints;
  for (const auto& [k, v] : to_hints(options.options)) spec.hints[k] = v;
  spec.parent = parent.spec.name;
  spec.route = reg.route;
  if (spec.route == Route::kSplit) {
    check_split_rules(parent, name);
    const BackendSpec pspec = parent.comm->backends();
    std::string filter = options.backend.empty() ? pspec.to_string() : qualified_filter(pspec, options.backend, name);
    // Always carry the parent's default device backend.
    BackendSpec f = BackendSpec::parse(filter);
    const DeviceType bound = parent.comm->device()->type;
    if (!f.has(bound)) f.set(bound, pspec.backend_for(bound));
    spec.backend = f.to_string();
  } else {
    spec.backend = options.backend.empty() ? parent.comm->backend_string() : BackendSpec::parse(options.backend).to_string();
  }
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    spec.creation_index = reg.next_index++;
  }
  check_hints_on_every_rank(spec);
  auto comm = create_group_comm(spec, parent, member_rank, comm_name);
  return register_group(std::move(spec), std::move(comm));
}

Group split_group(const Group& parent_group, std::span<const std::vector<int>> rank_lists,
                  const SplitGroupOptions& options) {
  const GroupState& parent = member_state(parent_group.state());
  auto& reg = registry();
  std::string name;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    name = options.name.empty() ? str::cat(parent.spec.name, "/split", ++reg.next_name) : options.name;
  }
  check_split_rules(parent, name);
  const BackendSpec pspec = parent.comm->backends();
  const DeviceType bound = parent.comm->device()->type;
  std::string filter = pspec.to_string();
  if (!options.backend.empty()) {
    for (std::string_view item : str::split(options.backend, ',', true)) {
      if (str::strip(item).find(':') == std::string_view::npos) {
        fail(ErrorCode::kInvalidArgument, name,
             str::cat("the backend filter '", options.backend, "' must be device-qualified, e.g. '",
                      pspec.to_string(), "'"));
      }
    }
    filter = qualified_filter(pspec, options.backend, name);
    if (!BackendSpec::parse(filter).has(bound)) {
      fail(ErrorCode::kInvalidArgument, name,
           str::cat("the backend filter '", options.backend, "' must include the parent's default device backend '",
                    to_string(bound), ":", pspec.backend_for(bound), "' (parent backends: ", pspec.to_string(), ")"));
    }
  }
  // Global ranks in, global ranks kept in the spec.
  std::set<int> seen;
  const std::vector<int>* mine = nullptr;
  for (const auto& list : rank_lists) {
    for (int g : list) {
      if (std::find(parent.spec.ranks.begin(), parent.spec.ranks.end(), g) == parent.spec.ranks.end()) {
        fail(ErrorCode::kInvalidArgument, name, str::cat("rank ", g, " is not in the parent group '", parent.spec.name, "'"));
      }
      if (!seen.insert(g).second) {
        fail(ErrorCode::kInvalidArgument, name, str::cat("rank ", g, " is in more than one list (lists must be disjoint)"));
      }
      if (g == parent.spec.ranks[static_cast<size_t>(parent.comm->rank())]) mine = &list;
    }
  }
  GroupSpec spec;
  spec.name = name;
  spec.description = options.description;
  if (mine) spec.ranks = *mine;
  spec.backend = filter;
  spec.timeout = options.timeout.value_or(parent.comm->op_timeout());
  spec.options = options.options;
  spec.hints = parent.spec.hints;
  for (const auto& [k, v] : to_hints(options.options)) spec.hints[k] = v;
  spec.parent = parent.spec.name;
  spec.route = Route::kSplit;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    spec.creation_index = reg.next_index++;
  }
  int member_rank = -1;
  if (mine) member_rank = static_cast<int>(std::find(mine->begin(), mine->end(), parent.spec.ranks[parent.comm->rank()]) - mine->begin());
  check_hints_on_every_rank(spec);
  auto comm = create_group_comm(spec, parent, member_rank);
  auto state = register_group(std::move(spec), std::move(comm));
  state->from_split_group = true;
  return member_rank >= 0 ? Group(state) : Group();
}

void retire(std::shared_ptr<Comm>& comm, const std::string& why) {
  if (!comm) return;
  auto c = std::move(comm);
  try {
    c->abort(why);
    c->finalize();
  } catch (const std::exception& e) {
    log::warning(str::cat("comms::dist: releasing '", c->name(), "': ", e.what()));
  }
}

void destroy_state(GroupState& s) {
  if (s.destroyed) return;
  s.destroyed = true;
  if (s.comm) {
    auto comm = std::move(s.comm);
    comm->finalize();  // raises any failure to release
  }
}

void destroy_process_group(const Group& group) {
  auto& reg = registry();
  if (!group.state()) return;  // non-member handle: nothing of ours to destroy
  if (group.state() == reg.world) {
    destroy_process_group();
    return;
  }
  destroy_state(*group.state());
  std::lock_guard<std::mutex> lock(reg.mu);
  std::erase(reg.groups, group.state());
}

void destroy_process_group() {
  auto& reg = registry();
  std::vector<std::shared_ptr<GroupState>> all;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    all = reg.groups;
  }
  std::string failures;
  ErrorCode first = ErrorCode::kOk;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      destroy_state(**it);
    } catch (const Error& e) {
      if (first == ErrorCode::kOk) first = e.code();
      str::append(failures, failures.empty() ? "" : "; ", e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.groups.clear();
    reg.world.reset();
  }
  if (!failures.empty()) throw Error(first, str::cat("comms::dist: destroying groups failed: ", failures));
}

}  // namespace comms::dist
