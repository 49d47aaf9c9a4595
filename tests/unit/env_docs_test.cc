// Every variable the library reads is documented in docs/ENVIRONMENT.md.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "config/env.h"
#include "plugins/plugin_registry.h"

TEST(EnvironmentDocs, EveryVariableTheLibraryReadsIsInTheTable) {
  std::ifstream f(COMMS_SOURCE_ROOT "/docs/ENVIRONMENT.md");
  ASSERT_TRUE(f) << "docs/ENVIRONMENT.md is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const auto& v : comms::env::documented()) {
    EXPECT_NE(doc.find(std::string("`") + v.name + "`"), std::string::npos)
        << v.name << " is read by the library but not documented in docs/ENVIRONMENT.md";
  }
  const auto plugin_variables = comms::internal::PluginRegistry::instance().env_variables();
  EXPECT_FALSE(plugin_variables.empty()) << "no plugin declares a variable (PluginDescriptor::env_variables)";
  for (const auto& v : plugin_variables) {
    EXPECT_NE(doc.find("`" + v.name + "`"), std::string::npos)
        << v.name << " is read by the " << v.plugin << " plugin but not documented in docs/ENVIRONMENT.md";
  }
}

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The library, its plugins and its tools (tests may set up their own
// environment as they like).
std::vector<std::filesystem::path> sources() {
  std::vector<std::filesystem::path> out;
  for (const char* dir : {"core", "backends", "tools", "examples", "include", "tests/conformance"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(COMMS_SOURCE_ROOT "/") + dir)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".cc" || ext == ".h")) out.push_back(e.path());
    }
  }
  return out;
}

}  // namespace

TEST(EnvironmentDocs, NoCodeReadsTheEnvironmentExceptThroughEnv) {
  const std::filesystem::path reader = COMMS_SOURCE_ROOT "/include/comms/env.h";
  size_t scanned = 0;
  for (const auto& path : sources()) {
    ++scanned;
    if (std::filesystem::equivalent(path, reader)) continue;
    const std::string text = read_file(path);
    for (const char* call : {"getenv(", "secure_getenv("}) {
      EXPECT_EQ(text.find(call), std::string::npos)
          << path << " calls " << call << "...): read variables through comms::env (include/comms/env.h, "
          << "core/config/env.h) so that they are validated and documented";
    }
  }
  EXPECT_GT(scanned, 50u) << "the source tree was not found under " COMMS_SOURCE_ROOT;
}

TEST(EnvironmentDocs, EveryVariableReadByNameIsInTheTable) {
  // env::get("X"), env::get_bool("X", ...), ...: the names read literally.
  // libcomms' and its tools' reads are in its table; a plugin's (under
  // backends/<name>/) in its own declared list, checked when it loads here.
  const std::regex read(R"(env::get\w*\(\s*"([A-Za-z0-9_]+)\")");
  std::set<std::string> table;
  for (const auto& v : comms::env::documented()) table.insert(v.name);
  std::map<std::string, std::set<std::string>> declared;  // plugin -> its variables
  for (const auto& p : comms::internal::PluginRegistry::instance().discover()) {
    if (!p.descriptor) continue;
    auto& names = declared[p.name];
    for (const auto* v = p.descriptor->env_variables; v && v->name; ++v) names.insert(v->name);
  }
  size_t found = 0;
  for (const auto& path : sources()) {
    const std::string rel = std::filesystem::relative(path, COMMS_SOURCE_ROOT).string();
    std::set<std::string> allowed = table;
    if (rel.starts_with("backends/")) {
      const std::string plugin = rel.substr(9, rel.find('/', 9) - 9);
      if (plugin != "cpu_algorithms") {
        if (!declared.count(plugin)) continue;  // not built or not loadable here
        allowed.insert(declared[plugin].begin(), declared[plugin].end());
      }
    }
    const std::string text = read_file(path);
    for (std::sregex_iterator it(text.begin(), text.end(), read), end; it != end; ++it) {
      ++found;
      EXPECT_TRUE(allowed.count((*it)[1].str()))
          << path << " reads " << (*it)[1].str()
          << ", which is not in the table (core/config/env.cc, or its plugin's PluginDescriptor::env_variables)";
    }
  }
  EXPECT_GT(found, 10u);
}
