// Plugin discovery and loading: found, missing, ABI mismatch, not a plugin,
// and hint routing across plugins.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "comm/comm_impl.h"
#include "comms/comms.h"
#include "plugins/plugin_registry.h"

namespace comms {
namespace {

using internal::PluginRegistry;

TEST(PluginLoading, FindsTheGlooPluginInTheBuildTree) {
  const auto& p = PluginRegistry::instance().get("gloo");
  EXPECT_EQ(p.name, "gloo");
  EXPECT_EQ(p.descriptor->abi_version, COMMS_PLUGIN_ABI_VERSION);
  EXPECT_EQ(p.descriptor->device_types, plugin::device_bit(DeviceType::kCpu));
  EXPECT_NE(p.path.find("libcomms-gloo.so"), std::string::npos);
}

TEST(PluginLoading, AMissingBackendListsTheAvailableOnes) {
  try {
    PluginRegistry::instance().get("nope");
    FAIL() << "loaded a plugin that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    const std::string m = e.what();
    EXPECT_NE(m.find("no plugin provides backend 'nope'"), std::string::npos) << m;
    EXPECT_NE(m.find("COMMS_BACKEND_LIB_NOPE"), std::string::npos) << m;
    EXPECT_NE(m.find("available backends:"), std::string::npos) << m;
    EXPECT_NE(m.find("gloo"), std::string::npos) << m;
  }
}

// The message a refused plugin gets, or "" if it loaded.
std::string refusal(const std::string& name, const char* path) {
  const std::string variable = "COMMS_BACKEND_LIB_" + name;
  setenv(variable.c_str(), path, 1);
  std::string why;
  try {
    PluginRegistry::instance().get(name);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    why = e.what();
  }
  unsetenv(variable.c_str());
  return why;
}

const std::string kOurAbi =
    std::to_string(COMMS_PLUGIN_ABI_MAJOR) + "." + std::to_string(COMMS_PLUGIN_ABI_MINOR);

TEST(PluginAbi, AShorterDescriptorOfTheSameMajorLoadsWithItsMissingEntriesAbsent) {
  setenv("COMMS_BACKEND_LIB_ABISHORT", TEST_PLUGIN_ABISHORT, 1);
  const auto& p = PluginRegistry::instance().get("abishort");
  unsetenv("COMMS_BACKEND_LIB_ABISHORT");
  EXPECT_EQ(p.descriptor->struct_size, plugin::kMinDescriptorSize);
  EXPECT_STREQ(p.descriptor->version, "0.0-abi");
  EXPECT_NE(p.descriptor->create, nullptr);
  // The plugin's memory past its struct_size holds non-null entries; they
  // must not be read.
  EXPECT_EQ(p.descriptor->device_count, nullptr);
  EXPECT_EQ(p.descriptor->explain_hints, nullptr);
}

TEST(PluginAbi, AnAbsentDeviceCountMeansOneDeviceOfEachSupportedType) {
  setenv("COMMS_BACKEND_LIB_ABISHORT", TEST_PLUGIN_ABISHORT, 1);
  bool seen = false;
  for (const auto& c : PluginRegistry::instance().capabilities(/*probe_devices=*/true)) {
    if (c.name != "abishort") continue;
    seen = true;
    // The junk device_count past struct_size would say 0 devices.
    EXPECT_EQ(c.devices_present, plugin::device_bit(DeviceType::kCuda));
  }
  unsetenv("COMMS_BACKEND_LIB_ABISHORT");
  EXPECT_TRUE(seen);
}

TEST(PluginAbi, ANewerMinorIsRefusedNamingBothVersions) {
  const std::string m = refusal("ABINEWERMINOR", TEST_PLUGIN_ABINEWERMINOR);
  const std::string theirs =
      std::to_string(COMMS_PLUGIN_ABI_MAJOR) + "." + std::to_string(COMMS_PLUGIN_ABI_MINOR + 1);
  EXPECT_NE(m.find("was built for plugin ABI version " + theirs + ", newer than this libcomms' ABI version " +
                   kOurAbi),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(TEST_PLUGIN_ABINEWERMINOR), std::string::npos) << m;
}

TEST(PluginAbi, AnotherMajorIsRefusedNamingBothVersions) {
  const std::string m = refusal("ABINEXTMAJOR", TEST_PLUGIN_ABINEXTMAJOR);
  EXPECT_NE(m.find("was built for plugin ABI version " + std::to_string(COMMS_PLUGIN_ABI_MAJOR + 1) +
                   ".0, but this libcomms implements ABI version " + kOurAbi),
            std::string::npos)
      << m;
}

// ABI 1 had only abi_version = 1 at offset 0, where every version keeps it.
TEST(PluginAbi, APluginOfTheUnversionedAbi1IsRefusedNamingBothVersions) {
  const std::string m = refusal("ABIV1", TEST_PLUGIN_ABIV1);
  EXPECT_NE(m.find("was built for plugin ABI version 1, but this libcomms implements ABI version " + kOurAbi),
            std::string::npos)
      << m;
}

TEST(PluginAbi, ADescriptorTooShortForTheRequiredEntriesIsRefused) {
  const std::string m = refusal("ABITINY", TEST_PLUGIN_ABITINY);
  EXPECT_NE(m.find("declares a descriptor of 8 bytes, smaller than the " +
                   std::to_string(plugin::kMinDescriptorSize) + " bytes"),
            std::string::npos)
      << m;
}

// Comms keep a pointer to their plugin's registry entry: replacing the
// plugin of a name (comms-conformance --plugin) must not free it.
TEST(PluginRegistryEntries, ReplacingAPluginByFileKeepsTheOldEntryForTheCommsUsingIt) {
  setenv("COMMS_BACKEND_LIB_STABLE", TEST_STABLE_PLUGIN, 1);
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto c = new_comm("cuda:stable", std::nullopt, "stable-entry", o);
  const auto& first = PluginRegistry::instance().get("stable");
  const auto& second = PluginRegistry::instance().load_file(TEST_STABLE_PLUGIN_COPY);
  unsetenv("COMMS_BACKEND_LIB_STABLE");
  EXPECT_NE(&first, &second);
  EXPECT_EQ(&PluginRegistry::instance().get("stable"), &second);
  // A freed entry reads as garbage here (and as a use-after-free under ASan).
  EXPECT_EQ(first.path, TEST_STABLE_PLUGIN);
  EXPECT_STREQ(first.descriptor->version, "1-first");
  EXPECT_STREQ(second.descriptor->version, "2-second");
  const std::string json = c->describe();
  EXPECT_NE(json.find("1-first"), std::string::npos) << json;
  EXPECT_EQ(json.find("2-second"), std::string::npos) << json;
}

TEST(PluginLoading, AFileThatIsNotAPluginIsRefusedClearly) {
  const std::string path = ::testing::TempDir() + "/libcomms-junk.so";
  std::ofstream(path) << "not an ELF file";
  setenv("COMMS_BACKEND_LIB_JUNK", path.c_str(), 1);
  try {
    PluginRegistry::instance().get("junk");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load plugin '" + path + "'"), std::string::npos) << e.what();
  }
  unsetenv("COMMS_BACKEND_LIB_JUNK");
}

// A system library of a plugin is missing (libgloo on a machine without
// libgloo0): the error names the library and, from the plugin's sidecar
// <plugin>.packages, the Debian package to install.
TEST(PluginLoading, AMissingSystemLibraryIsNamedWithItsPackage) {
  const std::string dir = ::testing::TempDir() + "/needsabsent";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/libcomms-needsabsent.so";
  // The copy needs libcomms_test_absenX.so, which no folder has (meson test's
  // LD_LIBRARY_PATH holds the real one): the name is renamed in place in its
  // string table, at the same length.
  std::string image;
  {
    std::ifstream in(TEST_NEEDS_ABSENT_PLUGIN, std::ios::binary);
    image.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string needed = "libcomms_test_absent.so";
  const auto at = image.find(needed + '\0');
  ASSERT_NE(at, std::string::npos) << "the plugin does not name " << needed;
  image[at + needed.size() - 4] = 'X';
  std::ofstream(path, std::ios::binary | std::ios::trunc) << image;
  std::ofstream(path + ".packages") << "# library package\nlibother.so.1 other-package\n"
                                    << "libcomms_test_absenX.so comms-test-absent1\n";
  setenv("COMMS_BACKEND_LIB_NEEDSABSENT", path.c_str(), 1);
  std::string why;
  try {
    PluginRegistry::instance().get("needsabsent");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    why = e.what();
  }
  unsetenv("COMMS_BACKEND_LIB_NEEDSABSENT");
  EXPECT_NE(why.find("cannot load plugin '" + path + "': libcomms_test_absenX.so: cannot open shared object file"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("libcomms_test_absenX.so comes with the Debian package comms-test-absent1 (apt-get install "
                     "comms-test-absent1)"),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("other-package"), std::string::npos) << why;
}

// A plugin is found by its file name without being opened, so a file whose
// descriptor declares another backend is refused when it is opened.
TEST(PluginLoading, AFileNamedForOneBackendThatDeclaresAnotherIsRefusedNamingBoth) {
  const std::string path = TEST_STABLE_PLUGIN_COPY;  // libcomms-stable-copy.so, declares "stable"
  setenv("COMMS_PLUGIN_PATH", path.substr(0, path.rfind('/')).c_str(), 1);
  try {
    PluginRegistry::instance().get("stable-copy");
    FAIL() << "loaded a plugin under a name its descriptor does not declare";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("plugin file '" + path + "' provides backend 'stable', not the requested "
                                         "'stable-copy'"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("name it libcomms-stable.so or point COMMS_BACKEND_LIB_STABLE at it"),
              std::string::npos)
        << e.what();
  }
  unsetenv("COMMS_PLUGIN_PATH");
}

TEST(PluginLoading, ThePluginPathIsSearchedFirst) {
  setenv("COMMS_PLUGIN_PATH", "/nonexistent/a:/nonexistent/b", 1);
  auto dirs = PluginRegistry::instance().search_dirs();
  ASSERT_GE(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], "/nonexistent/a");
  EXPECT_EQ(dirs[1], "/nonexistent/b");
  unsetenv("COMMS_PLUGIN_PATH");
}

class HintRouting : public ::testing::Test {
 protected:
  void SetUp() override { setenv("COMMS_BACKEND_LIB_FAKEGPU", TEST_FAKEGPU_PLUGIN, 1); }
  void TearDown() override { unsetenv("COMMS_HINTS_STRICT"); }
  BackendSpec both() { return BackendSpec::parse("cpu:gloo,cuda:fakegpu"); }
};

TEST_F(HintRouting, PrefixedKeysGoToTheirBackendWithThePrefixRemoved) {
  auto r = internal::route_hints({{"gloo.interface", "lo"}, {"fakegpu.min_ctas", "2"}}, both(), "t");
  EXPECT_EQ(r[0].at("interface"), "lo");
  EXPECT_EQ(r[1].at("min_ctas"), "2");
  EXPECT_EQ(r[0].count("min_ctas"), 0u);
}

TEST_F(HintRouting, UnprefixedKeysGoToTheOneBackendThatKnowsThem) {
  auto r = internal::route_hints({{"min_ctas", "4"}, {"busy_poll", "0"}}, both(), "t");
  EXPECT_EQ(r[1].at("min_ctas"), "4");
  EXPECT_EQ(r[0].at("busy_poll"), "0");
}

TEST_F(HintRouting, AKeyKnownToTwoBackendsMustBePrefixed) {
  try {
    internal::route_hints({{"interface", "lo"}}, both(), "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known to several backends"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fakegpu, gloo"), std::string::npos) << e.what();
  }
}

TEST_F(HintRouting, TheSameHintBareAndPrefixedIsAnErrorNotLastOneWins) {
  const std::pair<Hints, std::string> cases[] = {
      {{{"min_ctas", "8"}, {"fakegpu.min_ctas", "9"}},
       "hints 'fakegpu.min_ctas' and 'min_ctas' of comm 't' both set fakegpu's 'min_ctas'; give it once"},
      {{{"busy_poll", "1"}, {"gloo.busy_poll", "0"}},
       "hints 'busy_poll' and 'gloo.busy_poll' of comm 't' both set gloo's 'busy_poll'; give it once"},
  };
  for (const auto& [twice, why] : cases) {
    try {
      internal::route_hints(twice, both(), "t");
      ADD_FAILURE() << format_hints(twice) << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()), why);
    }
  }
}

TEST_F(HintRouting, UnknownKeysAreErrorsUnlessStrictIsOff) {
  EXPECT_THROW(internal::route_hints({{"no_such_key", "1"}}, both(), "t"), Error);
  EXPECT_THROW(internal::route_hints({{"gloo.min_ctas", "1"}}, both(), "t"), Error);
  EXPECT_THROW(internal::route_hints({{"nccl.min_ctas", "1"}}, both(), "t"), Error);
  setenv("COMMS_HINTS_STRICT", "0", 1);
  auto r = internal::route_hints({{"no_such_key", "1"}, {"busy_poll", "1"}}, both(), "t");
  EXPECT_EQ(r[0].size(), 1u);
  EXPECT_EQ(r[1].size(), 0u);
}

TEST(CommCreation, InvalidGlooHintsAreRejectedAtCreationWithTheValue) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.hints = {{"gloo.busy_poll", "sometimes"}};
  try {
    new_comm("gloo", std::nullopt, "bad-hint", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("busy_poll='sometimes'"), std::string::npos) << e.what();
  }
}

TEST(CommCreation, NamesAreUniqueAmongLiveComms) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto a = new_comm("gloo", Device::cpu(), "unique-name", o);
  EXPECT_THROW(new_comm("gloo", Device::cpu(), "unique-name", o), Error);
  a.reset();
  EXPECT_NO_THROW(new_comm("gloo", Device::cpu(), "unique-name", o));
}

TEST(CommCreation, SingleRankCommRunsEveryReductionLocally) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto c = new_comm("cpu:gloo", Device::cpu(), "single", o);
  std::vector<int32_t> in = {1, 2, 3}, out(3);
  c->all_reduce(BufferView::of(in), BufferView::of(out), ReduceOp::premul_sum(3));
  EXPECT_EQ(out, (std::vector<int32_t>{3, 6, 9}));
  EXPECT_EQ(in, (std::vector<int32_t>{1, 2, 3}));
  std::vector<float> f = {2.0f, 4.0f};
  c->all_reduce(BufferView::of(f), ReduceOp::avg());
  EXPECT_EQ(f, (std::vector<float>{2.0f, 4.0f}));
  auto json = c->describe();
  EXPECT_NE(json.find("\"backend\": \"cpu:gloo\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\": \"ready\""), std::string::npos) << json;
}

TEST(CommCreation, OpsOnADeviceTypeWithoutABackendFailClearly) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  auto c = new_comm("gloo", std::nullopt, "cpu-only", o);
  std::vector<float> x(4);
  auto view = BufferView::of(x);
  view.device = Device::cuda(0);
  try {
    c->all_reduce(view, ReduceOp::sum());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.comm(), "cpu-only");
    EXPECT_EQ(e.op(), "all_reduce");
    EXPECT_EQ(e.rank(), 0);
    EXPECT_NE(std::string(e.what()).find("no backend for device type 'cuda'"), std::string::npos) << e.what();
  }
  // The comm stays usable.
  c->all_reduce(BufferView::of(x), ReduceOp::sum());
}

// wait() on a device op only orders the caller's stream: the op may still be
// running, so the Work is not complete and its final status is still to come.
TEST_F(HintRouting, AStreamWaitLeavesTheWorkOpenAndALaterFailureIsReported) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.hints = {{"fakegpu.late_timeout", "1"}};
  auto c = new_comm("cuda:fakegpu", std::nullopt, "late-timeout", o);
  float x = 1;
  BufferView view{&x, 1, DataType::kFloat32, Device::cuda(0)};
  OpOptions async;
  async.async = true;
  Work w = c->all_reduce(view, ReduceOp::sum(), async);
  EXPECT_NO_THROW(w.wait());  // stream-ordered: returns at once
  EXPECT_FALSE(w.is_completed());
  EXPECT_EQ(w.status(), ErrorCode::kOk);  // not completed yet: nothing to report
  try {
    w.blocking_wait();
    FAIL() << "the op's timeout was lost after wait()";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_EQ(e.op(), "all_reduce");
  }
  EXPECT_TRUE(w.is_completed());
  EXPECT_EQ(w.status(), ErrorCode::kTimeout);
}

}  // namespace
}  // namespace comms
