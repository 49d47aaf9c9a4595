// comms-info: which plugins this libcomms finds, what a backend string maps
// to, what hints would configure (a dry run, no device needed), and every
// environment variable the library reads.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comms/comms.h"
#include "comms/plugin.h"  // COMMS_PLUGIN_ABI_VERSION
#include "util/strutil.h"

namespace {

using nlohmann::json;
using namespace comms;

json plugins_json() {
  json list = json::array();
  for (const auto& p : list_plugins()) {
    json j;
    j["name"] = p.name;
    j["path"] = p.path;
    if (p.error.empty()) {
      j["version"] = p.version;
      json devices = json::array();
      for (DeviceType t : p.devices) devices.push_back(std::string(to_string(t)));
      j["devices"] = devices;
      j["hint_keys"] = p.hint_keys;
    } else {
      j["error"] = p.error;
    }
    list.push_back(j);
  }
  return list;
}

json environment_json() {
  json env = json::object();
  for (const auto& v : environment()) env[v.name] = v.value ? json(*v.value) : json(nullptr);
  return env;
}

void print_text(const json& info) {
  std::cout << "comms " << info["version"].get<std::string>() << " (plugin ABI "
            << info["plugin_abi"].get<int>() << ")\n\nplugins:\n";
  for (const auto& p : info["plugins"]) {
    if (p.contains("error")) {
      std::cout << "  " << p["name"].get<std::string>() << "  not loadable: " << p["error"].get<std::string>() << "\n";
      continue;
    }
    std::string devices;
    for (const auto& d : p["devices"]) devices += (devices.empty() ? "" : ",") + d.get<std::string>();
    std::cout << "  " << p["name"].get<std::string>() << "  version " << p["version"].get<std::string>()
              << "  devices " << devices << "  (" << p["path"].get<std::string>() << ")\n";
  }
  std::cout << "\nplugin search path:\n";
  for (const auto& d : info["search_path"]) std::cout << "  " << d.get<std::string>() << "\n";
  if (info.contains("backend")) {
    std::cout << "\nbackend '" << info["backend"]["input"].get<std::string>() << "' -> "
              << info["backend"]["map"].get<std::string>() << "\n";
  }
  std::cout << "\nenvironment:\n";
  for (auto& [k, v] : info["environment"].items()) {
    std::cout << "  " << k << "=" << (v.is_null() ? "(unset)" : v.get<std::string>()) << "\n";
  }
}

// Every group's rank lists, as initialize_model_parallel would create them.
nlohmann::ordered_json parallel_json(const std::string& text) {
  const dist::ParallelFlags flags = dist::parse_parallel_flags(text);
  if (!flags.world) throw Error(ErrorCode::kInvalidArgument, "--parallel needs world=N");
  const dist::ParallelPlan plan = dist::plan_model_parallel(flags.config, *flags.world);
  if (flags.dp && *flags.dp != plan.dp) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("dp=", *flags.dp, " but world ", *flags.world, " / (tp*pp*cp) gives dp=", plan.dp));
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* name : {"tp", "pp", "dp", "cp", "dp_cp", "mp", "tp_cp", "tp_dp", "tp_dp_cp", "ep", "expt_tp",
                           "tp_ep", "tp_ep_pp", "expt_dp", "embd", "pos_embd"}) {
    out[name] = plan.find(name)->rank_lists;
  }
  return out;
}

std::string parallel_text_table(const std::string& text) {
  const auto j = parallel_json(text);
  std::string out;
  for (auto& [name, lists] : j.items()) str::append(out, name, ": ", lists.dump(), "\n");
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comms-info: plugins, backend maps, hint dry runs and environment of libcomms"};
  std::string backend;
  std::string hints_text;
  std::string json_path;
  auto* backend_opt = app.add_option("--backend", backend, "backend string to parse, e.g. cpu:gloo,cuda:nccl");
  auto* hints_opt = app.add_option("--hints", hints_text,
                                   "k=v,... hints: print the configuration they give (dry run)");
  std::string parallel_text;
  auto* parallel_opt = app.add_option(
      "--parallel", parallel_text,
      "world=N,tp=..,pp=..,cp=..,ep=..,etp=..,order=..,rank_offset=..: print the rank lists of every "
      "model-parallel group (Megatron's ordering), creating no communicator");
  // --json FILE, '-' for stdout: the same rule as comms-bench and comms-conformance.
  app.add_option("--json", json_path, "write one JSON object to FILE ('-': stdout) instead of the text")
      ->type_name("FILE");
  CLI11_PARSE(app, argc, argv);
  const bool as_json = !json_path.empty();
  std::ofstream json_file;
  if (as_json && json_path != "-") {
    json_file.open(json_path);
    if (!json_file) {
      std::fprintf(stderr, "comms-info: --json %s: cannot write there\n", json_path.c_str());
      return 2;
    }
  }
  std::ostream& json_out = json_file.is_open() ? json_file : std::cout;

  try {
    if (*parallel_opt) {
      if (as_json) {
        // One group per line: rank lists read better unbroken.
        const auto j = parallel_json(parallel_text);
        std::string out = "{";
        for (auto& [name, lists] : j.items()) str::append(out, out.size() > 1 ? ",\n  " : "\n  ", json(name).dump(), ": ", lists.dump());
        json_out << out << "\n}\n";
      } else {
        std::cout << parallel_text_table(parallel_text) << "\n";
      }
      return 0;
    }
    if (*hints_opt) {
      const BackendSpec spec = BackendSpec::parse(backend);
      json out = json::parse(explain_hints(spec, parse_hints(hints_text), "comms-info"));
      out["backend"] = spec.to_string();
      if (as_json) {
        json_out << out.dump(2) << "\n";
      } else {
        std::cout << "backend " << spec.to_string() << " with hints '" << hints_text << "':\n" << out.dump(2) << "\n";
      }
      return 0;
    }
    json info;
    info["version"] = library_version();
    info["plugin_abi"] = COMMS_PLUGIN_ABI_VERSION;
    info["plugins"] = plugins_json();
    info["search_path"] = plugin_search_path();
    if (*backend_opt) {
      const BackendSpec spec = BackendSpec::parse(backend);
      json map = json::object();
      for (int t = 0; t < kNumDeviceTypes; ++t) {
        const auto type = static_cast<DeviceType>(t);
        if (spec.has(type)) map[std::string(to_string(type))] = spec.backend_for(type);
      }
      info["backend"] = {{"input", backend}, {"map", spec.to_string()}, {"devices", map}};
    }
    info["environment"] = environment_json();
    if (as_json) json_out << info.dump(2) << "\n";
    else print_text(info);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "comms-info: %s: %s\n", std::string(to_string(e.code())).c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comms-info: internal: %s\n", e.what());
    return 2;
  }
}
