// comms::dist: process groups for trainers written against torch.distributed
// or Megatron's parallel_state, built on comms::Comm.
//
// Groups are created on one of two routes, chosen by COMMS_ROUTE:
//   direct (default)  each new group bootstraps its own communicators from
//                     the store and applies the typed options directly;
//   split             each group is carved from the bound world group with
//                     Comm::split, the typed options translated into hints.
// Both give the same membership, rank order, effective options and results.
// Every group keeps its full creation spec, so offload/reload (lifecycle.h)
// recreates it exactly.
//
// Threading: create and destroy groups from one thread; ops follow Comm's
// rules.
#pragma once

#include "comms/export.h"

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "comms/comm.h"
#include "comms/elastic.h"

namespace comms::dist {

enum class Route : uint8_t { kDirect, kSplit };
COMMS_API std::string_view to_string(Route r);
// COMMS_ROUTE: "direct" (default) or "split". Throws kInvalidArgument naming
// COMMS_ROUTE and its valid values.
COMMS_API Route route_from_environment();

// NCCL communicator options, as Megatron and torch.distributed name them.
// Each set field becomes one NCCL hint (kOptionSpellings below); unset fields
// keep NCCL's default. A test (tests/backends/nccl/nccl_options_test.cc) fails when
// the NCCL plugin accepts a key no field becomes, or a field becomes a key
// the plugin does not accept (blocking and comm_name are fixed by the plugin).
struct NcclOptions {
  std::optional<bool> is_high_priority_stream;
  std::optional<int> cga_cluster_size;
  std::optional<int> min_ctas;
  std::optional<int> max_ctas;
  std::optional<std::string> net_name;
  std::optional<int> split_share;
  std::optional<int> traffic_class;
  std::optional<int> collnet_enable;
  std::optional<int> cta_policy;
  std::optional<int> shrink_share;
  std::optional<int> nvls_ctas;
  std::optional<int> nchannels_per_net_peer;
  std::optional<int> nvlink_centric_sched;
  friend bool operator==(const NcclOptions&, const NcclOptions&) = default;
};

struct GlooOptions {
  std::optional<std::string> interface;
  std::optional<std::string> hostname;
  std::optional<bool> busy_poll;
  friend bool operator==(const GlooOptions&, const GlooOptions&) = default;
};

struct BackendOptions {
  NcclOptions nccl;
  GlooOptions gloo;
  Hints hints;  // anything else, passed through as given
  friend bool operator==(const BackendOptions&, const BackendOptions&) = default;
};

// One typed option: the name torch and Megatron give it (also its field's
// name), the hint it becomes, prefixed with its backend ("nccl", "gloo") so
// it is never routed to another, and access to its field.
enum class OptionType : uint8_t { kBool, kInt, kString };
using OptionValue = std::variant<bool, int, std::string>;  // index == OptionType
struct OptionSpelling {
  std::string_view name;
  std::string_view hint;
  OptionType type;
  std::optional<OptionValue> (*get)(const BackendOptions&);
  void (*set)(BackendOptions&, OptionValue);  // holds `type`, else std::bad_variant_access
  constexpr std::string_view backend() const { return hint.substr(0, hint.find('.')); }
};

}  // namespace comms::dist

// The table's rows, built from a field's member pointers.
namespace comms::internal {
template <class Field>
struct OptionField;
template <class Options, class T>
struct OptionField<std::optional<T> Options::*> {
  using type = T;
};
template <auto Group, auto Field>
constexpr dist::OptionSpelling option(std::string_view name, std::string_view hint) {
  using T = typename OptionField<decltype(Field)>::type;
  constexpr dist::OptionType type = std::is_same_v<T, bool>  ? dist::OptionType::kBool
                                    : std::is_same_v<T, int> ? dist::OptionType::kInt
                                                             : dist::OptionType::kString;
  return {name, hint, type,
          [](const dist::BackendOptions& o) -> std::optional<dist::OptionValue> {
            const std::optional<T>& v = o.*Group.*Field;
            if (!v) return std::nullopt;
            return dist::OptionValue(std::in_place_type<T>, *v);
          },
          [](dist::BackendOptions& o, dist::OptionValue v) { o.*Group.*Field = std::get<T>(std::move(v)); }};
}
}  // namespace comms::internal

namespace comms::dist {

// The one table of option spellings. to_hints, parse_communicator_config
// (parallel.h), the Python bindings (comms.dist.option_spellings) and
// comms.torch.Options read it: a new knob is a field above and a row here
// (and the key in its plugin).
inline constexpr OptionSpelling kOptionSpellings[] = {
    internal::option<&BackendOptions::nccl, &NcclOptions::is_high_priority_stream>("is_high_priority_stream",
                                                                                  "nccl.high_priority_stream"),
    internal::option<&BackendOptions::nccl, &NcclOptions::cga_cluster_size>("cga_cluster_size", "nccl.cga_cluster_size"),
    internal::option<&BackendOptions::nccl, &NcclOptions::min_ctas>("min_ctas", "nccl.min_ctas"),
    internal::option<&BackendOptions::nccl, &NcclOptions::max_ctas>("max_ctas", "nccl.max_ctas"),
    internal::option<&BackendOptions::nccl, &NcclOptions::net_name>("net_name", "nccl.net_name"),
    internal::option<&BackendOptions::nccl, &NcclOptions::split_share>("split_share", "nccl.split_share"),
    internal::option<&BackendOptions::nccl, &NcclOptions::traffic_class>("traffic_class", "nccl.traffic_class"),
    internal::option<&BackendOptions::nccl, &NcclOptions::collnet_enable>("collnet_enable", "nccl.collnet_enable"),
    internal::option<&BackendOptions::nccl, &NcclOptions::cta_policy>("cta_policy", "nccl.cta_policy"),
    internal::option<&BackendOptions::nccl, &NcclOptions::shrink_share>("shrink_share", "nccl.shrink_share"),
    internal::option<&BackendOptions::nccl, &NcclOptions::nvls_ctas>("nvls_ctas", "nccl.nvls_ctas"),
    internal::option<&BackendOptions::nccl, &NcclOptions::nchannels_per_net_peer>("nchannels_per_net_peer",
                                                                                 "nccl.nchannels_per_net_peer"),
    internal::option<&BackendOptions::nccl, &NcclOptions::nvlink_centric_sched>("nvlink_centric_sched",
                                                                               "nccl.nvlink_centric_sched"),
    internal::option<&BackendOptions::gloo, &GlooOptions::interface>("interface", "gloo.interface"),
    internal::option<&BackendOptions::gloo, &GlooOptions::hostname>("hostname", "gloo.hostname"),
    internal::option<&BackendOptions::gloo, &GlooOptions::busy_poll>("busy_poll", "gloo.busy_poll"),
};

// The row of `backend`'s option `name`, or null.
constexpr const OptionSpelling* find_option(std::string_view backend, std::string_view name) {
  for (const OptionSpelling& o : kOptionSpellings) {
    if (o.name == name && o.backend() == backend) return &o;
  }
  return nullptr;
}

// The one translation from typed options to hints, used by both routes:
// every set field becomes exactly one key, its row's hint. A field also
// given as a raw hint (options.hints) throws kInvalidArgument naming the key.
COMMS_API Hints to_hints(const BackendOptions& options);

struct InitOptions {
  // BackendSpec rules; "" uses COMMS_BACKEND, else the default map. A single
  // "nccl" given with a device becomes "cpu:gloo,cuda:nccl".
  std::string backend;
  // Binds the world eagerly: its device backend connects at once and a
  // one-element barrier runs on that device before init returns. On CPU,
  // Device::cpu() counts as a bindable device (the Gloo mesh connects
  // eagerly), which is what COMMS_ROUTE=split needs in a CPU-only job.
  std::optional<Device> device;
  std::optional<std::chrono::milliseconds> timeout;  // op timeout of the world
  std::shared_ptr<Store> store;
  std::optional<int> rank;
  std::optional<int> world_size;
  BackendOptions options;
  // CommOptions::elastic of the world (every group inherits it).
  std::optional<bool> elastic;
};

struct GroupOptions {
  std::string backend;  // "" = the world's backends
  std::optional<std::chrono::milliseconds> timeout;
  BackendOptions options;
  std::string name;         // "" = generated ("pg<N>"), the same on every rank
  std::string description;  // free text kept in the spec
};

struct SplitGroupOptions {
  std::optional<std::chrono::milliseconds> timeout;
  BackendOptions options;
  // Which of the parent's device backends to split. Must be device-qualified
  // and include the parent's default device backend ("" = all of them).
  std::string backend;
  std::string name;
  std::string description;
};

// Everything needed to create a group again, exactly.
struct GroupSpec {
  std::string name;
  std::string description;
  std::vector<int> ranks;  // global ranks, in group-rank order
  std::string backend;     // effective backend string
  std::chrono::milliseconds timeout{0};
  BackendOptions options;
  Hints hints;             // to_hints(options): what the comm was given
  std::string parent;      // "" for the world
  Route route = Route::kDirect;
  uint64_t creation_index = 0;
  friend bool operator==(const GroupSpec&, const GroupSpec&) = default;
};

class GroupState;

// A handle to a process group. Empty on ranks that are not members.
// Copies refer to the same group.
class COMMS_API Group {
 public:
  Group() = default;
  explicit Group(std::shared_ptr<GroupState> state) : state_(std::move(state)) {}

  explicit operator bool() const;
  bool is_member() const { return static_cast<bool>(*this); }
  int rank() const;
  int size() const;
  const std::vector<int>& global_ranks() const;
  std::string backend() const;
  std::optional<Device> device() const;
  Route route() const;
  const std::string& name() const;
  const GroupSpec& spec() const;
  // Every operation of the Comm API: group->all_reduce(...), group.comm().
  Comm& comm() const;
  Comm* operator->() const { return &comm(); }
  // The comm as a shared owner, for code that keeps it past the handle.
  std::shared_ptr<Comm> shared_comm() const;
  // The route and, for each backend, the effective configuration (for NCCL,
  // the ncclConfig_t fields and the stream priority), as JSON.
  std::string describe() const;

  const std::shared_ptr<GroupState>& state() const { return state_; }

 private:
  std::shared_ptr<GroupState> state_;
};

// Creates the world group. Collective over the job.
COMMS_API Group init_process_group(const InitOptions& options = {});
COMMS_API bool is_initialized();
// The world group; throws if init_process_group was not called.
COMMS_API Group world();

// Collective over the world with c10d semantics: every rank calls it with
// the same ranks, in the same order of calls; non-members get an empty Group.
COMMS_API Group new_group(std::span<const int> ranks, const GroupOptions& options = {});
// new_group({0, 2}, options).
inline Group new_group(std::initializer_list<int> ranks, const GroupOptions& options = {}) {
  return new_group(std::span<const int>(ranks.begin(), ranks.size()), options);
}
// Every rank passes the same disjoint rank lists (global ranks); each gets
// the group it is in, or an empty Group.
COMMS_API Group split_group(const Group& parent, std::span<const std::vector<int>> rank_lists,
                            const SplitGroupOptions& options = {});
// split_group(world, {{0, 1}, {2, 3}}).
inline Group split_group(const Group& parent, std::initializer_list<std::vector<int>> rank_lists,
                         const SplitGroupOptions& options = {}) {
  return split_group(parent, std::span<const std::vector<int>>(rank_lists.begin(), rank_lists.size()), options);
}

// Destroys a group's communicators (failures are raised). Destroying the
// world destroys every group, in reverse creation order. Destroying twice is
// harmless.
COMMS_API void destroy_process_group(const Group& group);
COMMS_API void destroy_process_group();  // the world and everything

// Every group of this process in creation order (including non-member
// entries, whose specs every rank keeps so replays stay collective).
COMMS_API std::vector<Group> groups();

// Elastic recovery of the world and its groups, after an op on any group
// failed because a rank was lost (comms/elastic.h does the comm level):
//
//   try { tp->all_reduce(x, ReduceOp::sum()); }
//   catch (const comms::Error& e) {
//     auto r = comms::dist::recover();           // every survivor calls it
//     if (r.excluded) return 0;                  // dropped by a rule: exit
//   }
//
// Every survivor calls it (collective over the survivors of the world). It
// revokes the world comm, agrees on the lost ranks through the store (so
// every survivor gets the same set and epoch), and replaces the world
// group's comm with the shrunk one: world ranks are renumbered in order.
// Then, in creation order, every group made through this API:
//   - holding no lost (or dropped) rank: keeps its Comm object, untouched;
//     only its GroupSpec::ranks are renumbered to the new world ranks;
//   - holding one: its old comm is aborted and a new one made for its
//     surviving members, in the same order, with the same spec (backend,
//     timeout, options, hints, route); the comm is named "<name>@e<epoch>",
//     the group keeps its name; with no surviving member it is destroyed;
//   - made by split_group: always split again from its (recovered) parent,
//     since no rank knows the other ranks' lists.
// Group handles are rebuilt in place: every copy of a Group (and the Python
// object) refers to the new comm. A Comm taken out earlier (comm(),
// shared_comm()) of a rebuilt group is aborted: take it again. Ranks that
// were not members of a group stay non-members (an empty Group).
//
// A rank blocked in an op of a group without a lost rank finishes that op
// first; recovery starts once every survivor has called recover() (each
// learns of the failure from its own failed op or from the world's
// revocation, which reaches an idle rank within about 100 ms).
struct RecoverOptions {
  AgreeOptions agree;
  // Alive ranks to drop too, decided from the lost set (world ranks before
  // the recovery, ascending) and the old world size; must give the same on
  // every rank. The dropped ranks get RecoverResult::excluded. If it throws,
  // the recovery completes without drops and then rethrows that error.
  std::function<std::vector<int>(const std::vector<int>& lost, int world_size)> exclude;
};

struct RecoverResult {
  bool excluded = false;     // this rank was dropped: its groups are gone, dist is uninitialized
  std::vector<int> lost;     // old world ranks, ascending
  std::vector<int> dropped;  // old world ranks dropped by RecoverOptions::exclude
  uint64_t epoch = 0;        // the new world comm's epoch
  int old_rank = -1;
  int rank = -1;             // in the new world; -1 if excluded
  int world_size = 0;        // of the new world
  std::vector<std::string> kept, rebuilt, removed;  // group names
  std::chrono::milliseconds took{0};
};
COMMS_API RecoverResult recover(const RecoverOptions& options = {});

// Growth of the world and its groups: newcomers (a replacement for a lost
// rank, or a rank a recovery dropped) join at a step boundary the members
// choose (comms/elastic.h does the comm level):
//
//   // every member, at each step boundary:
//   auto a = comms::dist::admit();               // nothing happens when nobody waits
//   if (a.grown) { /* send a.joined the model state */ }
//   // a newcomer, started with the job's store variables (COMMS_STORE etc.):
//   auto j = comms::dist::join_process_group();  // blocks until admitted
//
// admit() is collective over the members of the world. It calls
// comms::admit on the world comm: when nobody waits that is one store read
// (rank 0: one add and one set) and nothing else happens, the same Comm
// objects stay. Otherwise the world group's comm becomes the grown comm
// (members keep their ranks, newcomers get N, N+1, ... in the order they
// joined) and rank 0 sends the newcomers the group list through the store,
// so that every rank then holds the same specs and later group creation
// stays collective. The groups:
//   - made with new_group (an explicit rank list): keep their Comm objects
//     and members; the newcomers are not members (an empty Group), as a
//     rank outside the list at creation;
//   - made by split_group: kept too: their lists do not change and the
//     newcomers are in none (they take part, with no list, in the splits
//     reload_groups replays from the grown parent);
//   - of a model-parallel collection reshaped with admit_model_parallel
//     (parallel.h): derived again from the layout for the new world size
//     (dp grows): a group whose rank list is unchanged keeps its comm, one
//     whose list changed gets a new comm named "<name>@e<epoch>" (the old
//     one is aborted), one the old layout lacked is created; the newcomers
//     are members of their groups of the new layout.
// Group handles are rebuilt in place, as by recover(): a Comm taken out
// earlier (comm(), shared_comm()) of a rebuilt group is aborted. Every
// participant finishes with a barrier on the grown world, then the members
// release the old world comm. A member lost while the grown comm is built
// fails the admission with Error(kPeerFailure) on every member and nothing
// changes here: recover(), then admit again; the newcomer's join retries by
// itself. A rank lost later, while a collection's groups are made, fails
// those creations with its error; the ranks' group lists may then differ
// (a non-member registers a group its members failed to make), so recover()
// cannot follow: destroy_process_group() and start again. No group may be
// offloaded (reload_groups() first: kInvalidArgument).
struct AdmitResult {
  bool grown = false;       // false: nobody waited and nothing changed
  std::vector<int> joined;  // the newcomers' world ranks, ascending
  uint64_t epoch = 0;       // the world comm's epoch
  int rank = -1;            // in the world (unchanged on a member)
  int old_world_size = 0;   // the members
  int world_size = 0;
  // Group names: kept their comms; got a new comm; made for the new layout.
  std::vector<std::string> kept, rebuilt, created;
  std::chrono::milliseconds took{0};
};
COMMS_API AdmitResult admit(const AdmitOptions& options = {});

class ProcessGroupCollection;
struct JoinResult {
  AdmitResult admission;  // as the members see it; rank is this newcomer's
  // The collection the members reshaped with admit_model_parallel, with
  // this rank in its groups of the new layout; null after a plain admit().
  std::shared_ptr<ProcessGroupCollection> collection;
};
// Joins the world of an elastic job as a newcomer: comms::join("world"),
// then the group list the members send. Afterwards this process is
// initialized as if it had made every group itself (groups(), world(),
// new_group as on the members). kInvalidArgument when this process is
// already initialized; errors and timeouts as comms::join.
COMMS_API JoinResult join_process_group(const JoinOptions& options = {});

}  // namespace comms::dist
