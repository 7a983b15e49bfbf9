#include "runtime/core/env.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace sk {
namespace {

TEST(Env, TheTableIsInEnumOrderWithUniqueNamesUnderOnePrefix) {
  std::set<std::string> names;
  for (size_t i = 0; i < EnvVars().size(); ++i) {
    const EnvVarInfo& v = EnvVars()[i];
    EXPECT_EQ(static_cast<size_t>(v.var), i) << v.name;
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    if (v.old_name != nullptr) {
      EXPECT_TRUE(names.insert(v.old_name).second) << v.old_name << " twice";
    }
    if (v.owner == EnvOwner::kShardkit) {
      EXPECT_EQ(std::string(v.name).rfind("SK_", 0), 0u) << v.name << " lacks the SK_ prefix";
    } else {
      EXPECT_NE(std::string(v.name).rfind("SK_", 0), 0u) << v.name << " is not ours but has our prefix";
    }
    EXPECT_GT(std::string(v.meaning).size(), 20u) << v.name << " is not documented";
    EXPECT_GT(std::string(v.read_by).size(), 3u) << v.name;
  }
  EXPECT_EQ(&EnvVarInfoOf(EnvVar::kOpenblasCoretype), &EnvVars().back());
}

TEST(Env, EmptyIsUnsetAndTheOldNameIsReadWhenTheNewOneIsUnset) {
  ::unsetenv("SK_FLIGHT_RECORDER_DIR");
  ::unsetenv("SHARDKIT_FLIGHT_RECORDER_DIR");
  EXPECT_EQ(GetEnv(EnvVar::kFlightRecorderDir), nullptr);
  ::setenv("SHARDKIT_FLIGHT_RECORDER_DIR", "/old", 1);
  ASSERT_NE(GetEnv(EnvVar::kFlightRecorderDir), nullptr);
  EXPECT_STREQ(GetEnv(EnvVar::kFlightRecorderDir), "/old");
  ::setenv("SK_FLIGHT_RECORDER_DIR", "", 1);
  EXPECT_STREQ(GetEnv(EnvVar::kFlightRecorderDir), "/old") << "an empty new name counts as unset";
  ::setenv("SK_FLIGHT_RECORDER_DIR", "/new", 1);
  EXPECT_STREQ(GetEnv(EnvVar::kFlightRecorderDir), "/new") << "the new name wins";
  ::unsetenv("SK_FLIGHT_RECORDER_DIR");
  ::unsetenv("SHARDKIT_FLIGHT_RECORDER_DIR");
  ::setenv("SK_CPU_ISA", "", 1);
  EXPECT_EQ(GetEnv(EnvVar::kCpuIsa), nullptr);
  ::unsetenv("SK_CPU_ISA");
  EXPECT_STREQ(EnvName(EnvVar::kLocalWorldSize), "LOCAL_WORLD_SIZE");
}

// docs/environment.md holds the generated table verbatim: a variable added to
// the registry without regenerating the page fails here.
TEST(Env, TheDocsHoldTheGeneratedTable) {
  std::ifstream in("docs/environment.md");
  ASSERT_TRUE(in) << "docs/environment.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find(EnvVarsMarkdown()), std::string::npos)
      << "docs/environment.md's table is stale: regenerate it with ./bazelw run //tools:env_table";
}

// The frontends read the environment in their own languages; every name they
// read must be in the table (they read SHARDKIT_LIB and SHARDKIT_LIB_DIR
// outside it, undocumented, before 0.8.0).
TEST(Env, EveryVariableTheFrontendsReadIsInTheTable) {
  std::set<std::string> known;
  for (const EnvVarInfo& v : EnvVars()) {
    known.insert(v.name);
    if (v.old_name != nullptr) known.insert(v.old_name);
  }
  // Cargo's own, read by a build script.
  known.insert("CARGO_MANIFEST_DIR");
  // The names read by os.getenv("X"), env::var("X"), env::var_os("X") and
  // build.rs's set("X") (std::regex here tripped GCC 12's
  // -Wmaybe-uninitialized under --config=asan).
  const std::vector<std::string> readers = {"os.getenv(\"", "env::var_os(\"", "env::var(\"", "set(\""};
  int found = 0;
  for (const char* path : {"frontends/lua/shardkit.lua", "frontends/rust/build.rs", "frontends/rust/src/lib.rs",
                           "frontends/rust/src/sys.rs"}) {
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (const std::string& reader : readers) {
      for (size_t at = text.find(reader); at != std::string::npos; at = text.find(reader, at + 1)) {
        const size_t begin = at + reader.size();
        const size_t end = text.find('"', begin);
        if (end == std::string::npos) break;
        const std::string name = text.substr(begin, end - begin);
        if (name.empty() || name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos) {
          continue;
        }
        ++found;
        EXPECT_TRUE(known.count(name)) << path << " reads " << name << ", which runtime/core/env.cc does not declare";
      }
    }
  }
  EXPECT_GE(found, 4) << "the frontends' reads were not found: has their spelling changed?";
}

}  // namespace
}  // namespace sk
