// Plugin discovery and loading: found, missing, ABI mismatch, not a plugin,
// and hint routing across plugins.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "comm_impl.h"
#include "comms/comms.h"
#include "plugin_registry.h"

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

TEST(PluginLoading, AnAbiMismatchNamesBothVersions) {
  setenv("COMMS_BACKEND_LIB_BADABI", TEST_BAD_ABI_PLUGIN, 1);
  try {
    PluginRegistry::instance().get("badabi");
    FAIL() << "loaded a plugin with a foreign ABI version";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("ABI version 999"), std::string::npos) << m;
    EXPECT_NE(m.find("implements ABI version " + std::to_string(COMMS_PLUGIN_ABI_VERSION)), std::string::npos) << m;
  }
  unsetenv("COMMS_BACKEND_LIB_BADABI");
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
