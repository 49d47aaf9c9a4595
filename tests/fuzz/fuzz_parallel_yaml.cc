// The communicator-config YAML (comms::dist::parse_communicator_config),
// Megatron's --nccl-communicator-config-path format.
//   - Rejections are comms::Error kInvalidArgument; nothing else escapes
//     (yaml-cpp's exceptions included).
//   - A non-scalar (map, list or null) key where the parser reads keys is
//     never accepted, and the error saying so is given only for such a key.
//   - Accepted configs name known groups only; written back as YAML they parse
//     to the same options; to_hints of each group is lossless (one prefixed
//     key per field set).
//   - Planning a layout with them (every group created) accepts them or
//     rejects them with kInvalidArgument.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "comms/parallel.h"
#include "fuzz_check.h"

namespace {

using comms::ErrorCode;
using namespace comms::dist;

// True when the document has a non-scalar key where the parser reads keys
// (yaml-cpp's as<std::string>() would throw BadConversion on it).
bool has_non_scalar_key(std::string_view text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception&) {
    return false;
  }
  if (!root.IsMap()) return false;
  for (const auto& group : root) {
    if (!group.first.IsScalar()) return true;
    if (!group.second.IsMap()) continue;
    for (const auto& kv : group.second) {
      if (!kv.first.IsScalar()) return true;
      if (kv.first.Scalar() == "gloo" && kv.second.IsMap()) {
        for (const auto& g : kv.second)
          if (!g.first.IsScalar()) return true;
      }
    }
  }
  return false;
}

// Fields set, counted row by row of the one table; two rows that shared a
// hint would give to_hints fewer keys than this.
int count_fields(const BackendOptions& o) {
  int n = 0;
  for (const OptionSpelling& row : kOptionSpellings) n += row.get(o).has_value();
  return n;
}

// Well-formed UTF-8 (Unicode 15, table 3-7): no overlong forms, surrogates
// or code points above U+10FFFF.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
    if (c < 0x80) n = 1;
    else if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c == 0xe0) n = 3, lo = 0xa0;
    else if (c == 0xed) n = 3, hi = 0x9f;
    else if (c >= 0xe1 && c <= 0xef) n = 3;
    else if (c == 0xf0) n = 4, lo = 0x90;
    else if (c == 0xf4) n = 4, hi = 0x8f;
    else if (c >= 0xf1 && c <= 0xf3) n = 4;
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return false;
    }
    i += n;
  }
  return true;
}

// The YAML that says `config`, every string double-quoted; "" when a string
// is not UTF-8 (YAML cannot carry it; yaml-cpp's emitter replaces it).

std::string emit(const std::map<std::string, BackendOptions>& config) {
  YAML::Emitter out;
  bool utf8 = true;
  out << YAML::BeginMap;
  for (const auto& entry : config) {
    const std::string& group = entry.first;
    const BackendOptions& o = entry.second;  // a named reference: clang 14 cannot capture a structured binding
    utf8 = utf8 && valid_utf8(group);
    out << YAML::Key << YAML::DoubleQuoted << group << YAML::Value << YAML::BeginMap;
    // Every option of `backend` that is set, by its table row.
    auto put_all = [&](std::string_view backend) {
      for (const OptionSpelling& row : kOptionSpellings) {
        const auto v = row.get(o);
        if (!v || row.backend() != backend) continue;
        out << YAML::Key << std::string(row.name) << YAML::Value;
        if (const auto* str = std::get_if<std::string>(&*v)) {
          utf8 = utf8 && valid_utf8(*str);
          out << YAML::DoubleQuoted << *str;
        } else if (const auto* b = std::get_if<bool>(&*v)) {
          out << *b;
        } else {
          out << std::get<int>(*v);
        }
      }
    };
    put_all("nccl");
    if (o.gloo != GlooOptions{}) {
      out << YAML::Key << "gloo" << YAML::Value << YAML::BeginMap;
      put_all("gloo");
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return out.good() && utf8 ? std::string(out.c_str()) : std::string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, BackendOptions> config;
  try {
    config = parse_communicator_config(text);
  } catch (const comms::Error& e) {
    FUZZ_CHECK(e.code() == ErrorCode::kInvalidArgument, std::string(comms::to_string(e.code())) + ": " + e.what());
    FUZZ_CHECK(std::string_view(e.what()).starts_with("communicator config"), e.what());
    if (std::string_view(e.what()).ends_with(": a key must be a plain name, not a map, list or null")) {
      FUZZ_CHECK(has_non_scalar_key(text), std::string("a non-scalar key reported where there is none: ") + e.what());
    }
    return 0;
  } catch (const std::exception& e) {
    fuzz::fail(FUZZ_HERE, "threw something other than comms::Error", e.what());
  }

  FUZZ_CHECK(!has_non_scalar_key(text), "a config with a non-scalar key was accepted");
  const auto& names = group_names();
  for (const auto& [group, o] : config) {
    // Megatron's aliases, and its groups comms does not create (accepted, ignored).
    const bool alias = group == "ep_tp" || group == "tp_ep_mp" || group == "ep_dp" || group == "intra_dp_cp" ||
                       group == "hcp" || group == "intra_ep_dp" || group == "inter_ep_dp" ||
                       group == "intra_dist_opt_instance";
    FUZZ_CHECK(alias || std::find(names.begin(), names.end(), group) != names.end(), "unknown group '" + group + "' accepted");
    if (o.nccl.net_name) {
      std::string n = *o.nccl.net_name;
      std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      FUZZ_CHECK(n == "ib" || n == "socket", "net_name '" + *o.nccl.net_name + "' accepted");
    }
    const comms::Hints h = to_hints(o);
    FUZZ_CHECK(static_cast<int>(h.size()) == count_fields(o), "to_hints of '" + group + "' is not one key per field");
    for (const auto& [k, v] : h) FUZZ_CHECK(k.starts_with("nccl.") || k.starts_with("gloo."), "unprefixed hint '" + k + "'");
  }

  const std::string written = emit(config);
  if (!written.empty()) {
    std::map<std::string, BackendOptions> again;
    FUZZ_CHECK(fuzz::accepts([&] { again = parse_communicator_config(written); }, {}, "", FUZZ_HERE) && again == config,
               "the config written back does not parse to the same options:\n" + written);
  }

  ParallelConfig c;
  c.tp = 2;
  c.pp = 2;
  c.ep = 2;
  c.create_all_gather_groups = true;
  c.create_gloo_groups = true;
  c.group_options = config;
  fuzz::accepts([&] { plan_model_parallel(c, 8, "cpu:gloo,cuda:nccl"); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE);
  return 0;
}
