#include <gtest/gtest.h>

#include <vector>

#include "comms/backend_spec.h"
#include "comms/error.h"

namespace comms {
namespace {

const std::vector<PluginCapabilities> kWithGpu = {
    {"gloo", 1u << 0, 1u << 0},
    {"nccl", 1u << 1, 1u << 1},
};
const std::vector<PluginCapabilities> kNoGpu = {
    {"gloo", 1u << 0, 1u << 0},
    {"nccl", 1u << 1, 0},
};

ErrorCode code_of(std::string_view text, std::string* message = nullptr) {
  try {
    BackendSpec::parse(text, kWithGpu);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

TEST(BackendSpec, BareNamesMapToEveryDeviceTheirPluginSupports) {
  EXPECT_EQ(BackendSpec::parse("gloo", kWithGpu).to_string(), "cpu:gloo");
  EXPECT_EQ(BackendSpec::parse("nccl", kWithGpu).to_string(), "cuda:nccl");
  EXPECT_EQ(BackendSpec::parse("gloo,nccl", kWithGpu).to_string(), "cpu:gloo,cuda:nccl");
}

TEST(BackendSpec, PairsParseIgnoringCaseAndWhitespace) {
  auto s = BackendSpec::parse("  CUDA:NCCL , cpu : Gloo ", kWithGpu);
  EXPECT_EQ(s.to_string(), "cpu:gloo,cuda:nccl");
  EXPECT_EQ(s.backend_for(DeviceType::kCuda), "nccl");
  EXPECT_EQ(BackendSpec::parse(s.to_string(), kWithGpu), s);
}

TEST(BackendSpec, EmptyAndUndefinedGiveTheDefaultMap) {
  EXPECT_EQ(BackendSpec::parse("", kWithGpu).to_string(), "cpu:gloo,cuda:nccl");
  EXPECT_EQ(BackendSpec::parse("undefined", kWithGpu).to_string(), "cpu:gloo,cuda:nccl");
  EXPECT_EQ(BackendSpec::parse("", kNoGpu).to_string(), "cpu:gloo");
  EXPECT_EQ(BackendSpec::parse("", std::vector<PluginCapabilities>{{"gloo", 1, 1}}).to_string(), "cpu:gloo");
}

TEST(BackendSpec, EveryErrorNamesTheOffendingPart) {
  std::string m;
  EXPECT_EQ(code_of("cpu:", &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("'cpu:'"), std::string::npos) << m;
  EXPECT_NE(m.find("device:backend"), std::string::npos) << m;

  EXPECT_EQ(code_of("cpu:gloo:x", &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("'cpu:gloo:x'"), std::string::npos) << m;

  EXPECT_EQ(code_of("cpu:gloo,cpu:gloo", &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("'cpu' appears twice"), std::string::npos) << m;

  EXPECT_EQ(code_of("tpu:gloo", &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("'tpu'"), std::string::npos) << m;
  EXPECT_NE(m.find("cpu or cuda"), std::string::npos) << m;

  EXPECT_EQ(code_of("cpu:nope", &m), ErrorCode::kNotFound);
  EXPECT_NE(m.find("'nope'"), std::string::npos) << m;
  EXPECT_NE(m.find("available backends: gloo, nccl"), std::string::npos) << m;

  EXPECT_EQ(code_of("cpu:nccl", &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("'nccl' does not support device type 'cpu'"), std::string::npos) << m;
  EXPECT_NE(m.find("supports: cuda"), std::string::npos) << m;

  EXPECT_EQ(code_of("gloo,cpu:gloo", &m), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of("gloo,,nccl", &m), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.find("empty entry"), std::string::npos) << m;
}

TEST(BackendSpec, RuntimeParseFindsTheBuiltGlooPlugin) {
  EXPECT_EQ(BackendSpec::parse("gloo").to_string(), "cpu:gloo");
  try {
    BackendSpec::parse("cpu:nope");
    FAIL() << "accepted a backend no plugin provides";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("available backends:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gloo"), std::string::npos) << e.what();
  }
}

TEST(BackendSpec, ASplitFilterSelectsTheParentsEntriesItNames) {
  const BackendSpec parent = BackendSpec::parse("cpu:gloo,cuda:nccl", kWithGpu);
  EXPECT_EQ(parent.select("nccl").to_string(), "cuda:nccl");
  EXPECT_EQ(parent.select(" CPU : Gloo , ").to_string(), "cpu:gloo");
  EXPECT_EQ(parent.select("gloo,cuda:nccl"), parent);
  EXPECT_TRUE(parent.select(" , ").empty());

  auto message_of = [](const BackendSpec& p, std::string_view filter) {
    try {
      p.select(filter);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message_of(parent, "mpi"),
            "Requested backend 'mpi' is not present in the parent group (parent backends: cpu:gloo,cuda:nccl)");
  EXPECT_EQ(message_of(BackendSpec::parse("gloo", kWithGpu), "cuda:nccl"),
            "Requested backend for device 'cuda' is not present in the parent group (parent backends: cpu:gloo)");
  EXPECT_NE(message_of(parent, "cpu:mpi").find("'mpi' for device 'cpu' differs from the parent's 'gloo'"),
            std::string::npos);
  EXPECT_NE(message_of(parent, "tpu:gloo").find("unknown device type 'tpu'"), std::string::npos);
}

}  // namespace
}  // namespace comms
