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

int count_fields(const BackendOptions& o) {
  const auto& n = o.nccl;
  const auto& g = o.gloo;
  return !!n.is_high_priority_stream + !!n.cga_cluster_size + !!n.min_ctas + !!n.max_ctas + !!n.net_name +
         !!n.split_share + !!n.traffic_class + !!n.collnet_enable + !!n.cta_policy + !!n.nvls_ctas + !!g.interface +
         !!g.hostname + !!g.busy_poll;
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
  for (const auto& [group, o] : config) {
    utf8 = utf8 && valid_utf8(group);
    out << YAML::Key << YAML::DoubleQuoted << group << YAML::Value << YAML::BeginMap;
    auto put = [&](const char* key, const auto& v) {
      if (!v) return;
      out << YAML::Key << key << YAML::Value;
      if constexpr (std::is_same_v<std::decay_t<decltype(*v)>, std::string>) {
        utf8 = utf8 && valid_utf8(*v);
        out << YAML::DoubleQuoted << *v;
      }
      else out << *v;
    };
    put("is_high_priority_stream", o.nccl.is_high_priority_stream);
    put("cga_cluster_size", o.nccl.cga_cluster_size);
    put("min_ctas", o.nccl.min_ctas);
    put("max_ctas", o.nccl.max_ctas);
    put("net_name", o.nccl.net_name);
    if (o.gloo != GlooOptions{}) {
      out << YAML::Key << "gloo" << YAML::Value << YAML::BeginMap;
      put("interface", o.gloo.interface);
      put("hostname", o.gloo.hostname);
      put("busy_poll", o.gloo.busy_poll);
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
