#include "spec_json.h"

namespace comms::dist {

using nlohmann::json;
using std::chrono::milliseconds;

namespace {

template <class T>
json optional_json(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}
template <class T>
std::optional<T> optional_from(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<T>();
}

}  // namespace

// Typed options by their spelling table's names: a new knob needs no change here.
json options_to_json(const BackendOptions& options) {
  json typed = json::object();
  for (const OptionSpelling& row : kOptionSpellings) {
    const std::optional<OptionValue> v = row.get(options);
    if (!v) continue;
    json& slot = typed[std::string(row.hint)];
    std::visit([&](const auto& x) { slot = x; }, *v);
  }
  json hints = json::object();
  for (const auto& [k, v] : options.hints) hints[k] = v;
  return json{{"typed", typed}, {"hints", hints}};
}

BackendOptions options_from_json(const json& j) {
  BackendOptions o;
  for (const auto& [hint, value] : j.at("typed").items()) {
    for (const OptionSpelling& row : kOptionSpellings) {
      if (row.hint != hint) continue;
      switch (row.type) {
        case OptionType::kBool: row.set(o, value.get<bool>()); break;
        case OptionType::kInt: row.set(o, value.get<int>()); break;
        case OptionType::kString: row.set(o, value.get<std::string>()); break;
      }
    }
  }
  for (const auto& [k, v] : j.at("hints").items()) o.hints[k] = v.get<std::string>();
  return o;
}

json spec_to_json(const GroupSpec& s) {
  json hints = json::object();
  for (const auto& [k, v] : s.hints) hints[k] = v;
  return json{{"name", s.name},
              {"description", s.description},
              {"ranks", s.ranks},
              {"backend", s.backend},
              {"timeout_ms", s.timeout.count()},
              {"options", options_to_json(s.options)},
              {"hints", hints},
              {"parent", s.parent},
              {"route", std::string(to_string(s.route))},
              {"creation_index", s.creation_index}};
}

GroupSpec spec_from_json(const json& j) {
  GroupSpec s;
  s.name = j.at("name").get<std::string>();
  s.description = j.at("description").get<std::string>();
  s.ranks = j.at("ranks").get<std::vector<int>>();
  s.backend = j.at("backend").get<std::string>();
  s.timeout = milliseconds(j.at("timeout_ms").get<int64_t>());
  s.options = options_from_json(j.at("options"));
  for (const auto& [k, v] : j.at("hints").items()) s.hints[k] = v.get<std::string>();
  s.parent = j.at("parent").get<std::string>();
  s.route = j.at("route").get<std::string>() == "split" ? Route::kSplit : Route::kDirect;
  s.creation_index = j.at("creation_index").get<uint64_t>();
  return s;
}

json config_to_json(const ParallelConfig& c) {
  json group_options = json::object();
  for (const auto& [name, o] : c.group_options) group_options[name] = options_to_json(o);
  return json{{"tp", c.tp},
              {"pp", c.pp},
              {"cp", c.cp},
              {"ep", c.ep},
              {"expert_tp", optional_json(c.expert_tp)},
              {"order", c.order},
              {"rank_offset", c.rank_offset},
              {"world_size", optional_json(c.world_size)},
              {"timeout_ms", c.timeout ? json(c.timeout->count()) : json(nullptr)},
              {"backend", c.backend},
              {"create_gloo_groups", c.create_gloo_groups},
              {"create_all_gather_groups", c.create_all_gather_groups},
              {"group_options", group_options},
              {"high_priority_groups", c.high_priority_groups},
              {"name", c.name}};
}

ParallelConfig config_from_json(const json& j) {
  ParallelConfig c;
  c.tp = j.at("tp").get<int>();
  c.pp = j.at("pp").get<int>();
  c.cp = j.at("cp").get<int>();
  c.ep = j.at("ep").get<int>();
  c.expert_tp = optional_from<int>(j.at("expert_tp"));
  c.order = j.at("order").get<std::string>();
  c.rank_offset = j.at("rank_offset").get<int>();
  c.world_size = optional_from<int>(j.at("world_size"));
  if (const auto t = optional_from<int64_t>(j.at("timeout_ms"))) c.timeout = milliseconds(*t);
  c.backend = j.at("backend").get<std::string>();
  c.create_gloo_groups = j.at("create_gloo_groups").get<bool>();
  c.create_all_gather_groups = j.at("create_all_gather_groups").get<bool>();
  for (const auto& [name, o] : j.at("group_options").items()) c.group_options[name] = options_from_json(o);
  c.high_priority_groups = j.at("high_priority_groups").get<std::vector<std::string>>();
  c.name = j.at("name").get<std::string>();
  return c;
}

}  // namespace comms::dist
