// The public introspection calls (comms/info.h) and the Comm accessors the
// tools use instead of the library's internals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms {
namespace {

const PluginInfo* find(const std::vector<PluginInfo>& plugins, const std::string& name) {
  auto it = std::find_if(plugins.begin(), plugins.end(), [&](const PluginInfo& p) { return p.name == name; });
  return it == plugins.end() ? nullptr : &*it;
}

TEST(PublicInfo, ListPluginsReportsTheBuiltGlooPluginWithItsDevicesAndHintKeys) {
  const auto plugins = list_plugins();
  const PluginInfo* gloo = find(plugins, "gloo");
  ASSERT_NE(gloo, nullptr) << "gloo not listed; search path has " << plugin_search_path().size() << " dirs";
  EXPECT_EQ(gloo->error, "");
  EXPECT_NE(gloo->path.find("libcomms-gloo.so"), std::string::npos) << gloo->path;
  EXPECT_EQ(gloo->devices, std::vector<DeviceType>{DeviceType::kCpu});
  EXPECT_EQ(gloo->hint_keys, (std::vector<std::string>{"interface", "hostname", "busy_poll"}));
}

TEST(PublicInfo, LoadPluginTakesTheNameFromTheDescriptorAndRefusesAForeignAbi) {
  const PluginInfo fake = load_plugin(TEST_FAKEGPU_PLUGIN);
  EXPECT_EQ(fake.name, "fakegpu");
  EXPECT_EQ(fake.devices, std::vector<DeviceType>{DeviceType::kCuda});
  EXPECT_EQ(plugin_device_count("fakegpu", DeviceType::kCpu), 0);
  try {
    load_plugin(TEST_PLUGIN_ABINEXTMAJOR);
    FAIL() << "loaded a plugin with a foreign ABI version";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("3.0"), std::string::npos) << e.what();
  }
}

TEST(PublicInfo, ExplainHintsGivesTheBackendsConfigAndNamesTheCommInErrors) {
  const auto spec = BackendSpec::parse("cpu:gloo");
  const auto on = nlohmann::json::parse(explain_hints(spec, {{"gloo.busy_poll", "1"}}, "my-tool"));
  const auto off = nlohmann::json::parse(explain_hints(spec, {{"busy_poll", "0"}}, "my-tool"));
  ASSERT_TRUE(on.contains("gloo_config")) << on.dump();
  EXPECT_EQ(on["gloo_config"]["busy_poll"], "1") << on.dump();
  EXPECT_EQ(off["gloo_config"]["busy_poll"], "0") << off.dump();
  try {
    explain_hints(spec, {{"busy_poll", "1"}, {"gloo.busy_poll", "0"}}, "my-tool");
    FAIL() << "accepted one setting given twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("of comm 'my-tool'"), std::string::npos) << e.what();
  }
}

TEST(PublicInfo, EnvironmentListsEveryVariableAndNeverShowsTheToken) {
  setenv("COMMS_STORE_TOKEN", "s3cret", 1);
  setenv("COMMS_BACKEND_LIB_INFOTEST", "/some/lib.so", 1);
  unsetenv("COMMS_OP_TIMEOUT");
  const auto entries = environment();
  unsetenv("COMMS_STORE_TOKEN");
  unsetenv("COMMS_BACKEND_LIB_INFOTEST");
  auto value_of = [&](const std::string& name) -> const EnvironmentEntry* {
    for (const auto& e : entries) {
      if (e.name == name) return &e;
    }
    return nullptr;
  };
  ASSERT_NE(value_of("COMMS_STORE_TOKEN"), nullptr);
  EXPECT_EQ(value_of("COMMS_STORE_TOKEN")->value, "(set, not shown)");
  ASSERT_NE(value_of("COMMS_OP_TIMEOUT"), nullptr);
  EXPECT_EQ(value_of("COMMS_OP_TIMEOUT")->value, std::nullopt);
  ASSERT_NE(value_of("COMMS_BACKEND_LIB_INFOTEST"), nullptr);
  EXPECT_EQ(value_of("COMMS_BACKEND_LIB_INFOTEST")->value, "/some/lib.so");
  for (const auto& e : entries) EXPECT_EQ(e.name.find('<'), std::string::npos) << e.name;
}

TEST(PublicInfo, ACommReportsItsLocalPlaceAndTheStoreItRendezvousedThrough) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.store = make_memory_store();
  auto c = new_comm("cpu:gloo", Device::cpu(), "info-accessors", o);
  EXPECT_EQ(c->local_rank(), 0);
  EXPECT_EQ(c->local_size(), 1);
  EXPECT_EQ(c->store(), o.store);
}

}  // namespace
}  // namespace comms
