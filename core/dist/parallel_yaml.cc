// Megatron's --nccl-communicator-config-path files, read with yaml-cpp.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "comms/parallel.h"
#include "dist_state.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

[[noreturn]] void invalid(const std::string& where, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, str::cat("communicator config", where, ": ", why));
}

std::string at(const YAML::Node& n) {
  const auto m = n.Mark();
  return m.is_null() ? std::string() : str::cat(" (line ", m.line + 1, ")");
}

template <typename T>
T scalar(const YAML::Node& n, const std::string& where, const char* type) {
  if (!n.IsScalar()) invalid(where + at(n), str::cat("expected ", type));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    invalid(where + at(n), str::cat("'", n.Scalar(), "' is not ", type));
  }
}

// The key of a map entry: a plain scalar, each at most once per map (yaml-cpp
// keeps duplicates, and as<std::string>() throws on a map or list key).
std::string key_of(const YAML::Node& key, const std::string& where, std::set<std::string>& seen) {
  if (!key.IsScalar()) invalid(where + at(key), "a key must be a plain name, not a map, list or null");
  std::string name = key.Scalar();
  if (!seen.insert(name).second) invalid(where + at(key), str::cat("key '", name, "' is given twice"));
  return name;
}

// The names of `backend`'s options, for errors.
std::string option_names(std::string_view backend) {
  std::string names;
  for (const OptionSpelling& row : kOptionSpellings) {
    if (row.backend() == backend) names += str::cat(names.empty() ? "" : ", ", row.name);
  }
  return names;
}

// Sets `row`'s field of `o` from the node, checked against its type.
void set_option(const OptionSpelling& row, const YAML::Node& value, const std::string& here, BackendOptions& o) {
  switch (row.type) {
    case OptionType::kBool: row.set(o, scalar<bool>(value, here, "a boolean")); break;
    case OptionType::kInt: row.set(o, scalar<int>(value, here, "an integer")); break;
    case OptionType::kString: row.set(o, scalar<std::string>(value, here, "a string")); break;
  }
}

void parse_gloo(const YAML::Node& node, const std::string& where, BackendOptions& o) {
  if (!node.IsMap()) invalid(where + at(node), str::cat("expected a map of ", option_names("gloo")));
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = key_of(kv.first, where, seen);
    const OptionSpelling* row = find_option("gloo", key);
    if (!row) invalid(str::cat(where, ".", key) + at(kv.first), str::cat("unknown key; gloo keys are ", option_names("gloo")));
    set_option(*row, kv.second, str::cat(where, ".", key), o);
  }
}

BackendOptions parse_group(const YAML::Node& node, const std::string& group) {
  const std::string where = str::cat(" '", group, "'");
  if (node.IsNull()) return {};
  if (!node.IsMap()) invalid(where + at(node), "expected a map of communicator options");
  BackendOptions o;
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = key_of(kv.first, where, seen);
    const std::string here = str::cat(" '", group, ".", key, "'");
    if (key == "gloo") {
      parse_gloo(kv.second, here, o);
      continue;
    }
    const OptionSpelling* row = find_option("nccl", key);
    if (!row) invalid(here + at(kv.first), str::cat("unknown key; keys are ", option_names("nccl"), ", gloo"));
    set_option(*row, kv.second, here, o);
    if (key == "net_name") {
      // As Megatron: NCCL's network plugins are named IB and Socket.
      const std::string v = *o.nccl.net_name;
      if (str::lower(v) != "ib" && str::lower(v) != "socket") {
        invalid(here + at(kv.second), str::cat("net_name '", v, "' is not supported; accepted: IB, Socket"));
      }
    }
  }
  return o;
}

}  // namespace

std::map<std::string, BackendOptions> parse_communicator_config(std::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    invalid("", str::cat("not valid YAML: ", e.what()));
  }
  std::map<std::string, BackendOptions> out;
  if (root.IsNull()) return out;
  if (!root.IsMap()) invalid(at(root), "expected a map from group name to options");
  const auto& names = group_names();
  std::set<std::string> seen, canonical_seen;
  for (const auto& kv : root) {
    const std::string group = key_of(kv.first, "", seen);
    const bool alias = is_megatron_alias(group) || is_megatron_only_group(group);
    const std::string canonical = canonical_group_name(group);
    if (!canonical_seen.insert(canonical).second) {
      invalid(str::cat(" '", group, "'", at(kv.first)),
              str::cat("group '", canonical, "' is given twice (by its name and by Megatron's alias)"));
    }
    if (!alias && std::find(names.begin(), names.end(), group) == names.end()) {
      invalid(str::cat(" '", group, "'", at(kv.first)),
              str::cat("unknown group; groups are ", str::join(names, ", "),
                       " (and Megatron's ep_tp, tp_ep_mp, ep_dp, and its intra_dp_cp, hcp, intra_ep_dp, "
                       "inter_ep_dp, intra_dist_opt_instance, whose options are ignored)"));
    }
    out[group] = parse_group(kv.second, group);
  }
  return out;
}

std::map<std::string, BackendOptions> load_communicator_config(const std::string& path) {
  // A directory opens as an empty stream and /dev/null reads as an empty
  // (valid) config: both would silently give no options.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(ErrorCode::kNotFound,
                str::cat("communicator config '", path, "' cannot be read: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("communicator config '", path, "' is not a regular file (",
                         S_ISDIR(st.st_mode) ? "a directory" : "a device, pipe or socket", "); give a YAML file"));
  }
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kNotFound, str::cat("communicator config '", path, "' cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_communicator_config(ss.str());
  } catch (const Error& e) {
    throw Error(e.code(), str::cat(path, ": ", e.what()));
  }
}

}  // namespace comms::dist
