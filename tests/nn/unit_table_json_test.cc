// Unit tables as JSON (runtime/nn/unit_table_json.h): every named table
// survives the round trip as the same model, a file stands wherever a model
// name does, and malformed tables are InvalidArgument naming the field.
#include "runtime/nn/unit_table_json.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/nn/configs.h"
#include "tests/util/child_process.h"

namespace sk {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(UnitTableJson, EveryNamedTableRoundTripsToTheSameModel) {
  int tables = 0;
  for (const NamedModelConfig& c : ModelConfigs()) {
    if (c.family != ModelFamily::kUnitTable) continue;
    ++tables;
    const std::string text = UnitTableToJson(c.table);
    auto back = UnitTableFromJson(text, c.name);
    ASSERT_TRUE(back.ok()) << c.name << ": " << back.status();
    EXPECT_EQ(UnitTableToJson(*back), text) << c.name;
    auto a = CreateModel(c);
    NamedModelConfig copy = c;
    copy.table = *back;
    auto b = CreateModel(copy);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*a)->num_parameters(), (*b)->num_parameters()) << c.name;
    ASSERT_EQ((*a)->units().size(), (*b)->units().size()) << c.name;
    for (size_t u = 0; u < (*a)->units().size(); ++u) {
      const UnitSpec& ua = (*a)->units()[u];
      const UnitSpec& ub = (*b)->units()[u];
      EXPECT_EQ(ua.name, ub.name);
      ASSERT_EQ(ua.params.size(), ub.params.size()) << ua.name;
      for (size_t p = 0; p < ua.params.size(); ++p) {
        EXPECT_EQ(ua.params[p].name, ub.params[p].name);
        EXPECT_EQ(ua.params[p].shape, ub.params[p].shape) << ua.name << "." << ua.params[p].name;
      }
    }
    EXPECT_EQ((*a)->Flops(4, 1, 0).model_flops, (*b)->Flops(4, 1, 0).model_flops) << c.name;
    EXPECT_EQ((*a)->PeakActivationBytes(4, 1, 0, DeviceKind::kCpu), (*b)->PeakActivationBytes(4, 1, 0, DeviceKind::kCpu)) << c.name;
  }
  EXPECT_GE(tables, 4);  // regnet-tiny, deepvit-tiny, regnet-9b, deepvit-8b
}

TEST(UnitTableJson, AFileStandsWhereAModelNameDoes) {
  auto named = FindModelConfig("regnet-tiny");
  ASSERT_TRUE(named.ok());
  UnitTableConfig t = named->table;
  t.name = "my-regnet";
  const std::string path = TempPath("my-regnet.json");
  Write(path, UnitTableToJson(t));
  auto c = FindModelConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kUnitTable);
  EXPECT_EQ(c->name, "my-regnet");
  EXPECT_EQ(c->seq_len, 1);
  auto m = CreateModel(path);
  ASSERT_TRUE(m.ok()) << m.status();
  auto ref = CreateModel("regnet-tiny");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ((*m)->num_parameters(), (*ref)->num_parameters());

  auto missing = FindModelConfig(TempPath("no-such-table.json"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("no-such-table.json"), std::string::npos);
}

// A table path that is a FIFO (or a device, or a directory) is refused at
// once: opening a FIFO without a writer blocked sk_plan and trainer creation
// for ever. In a child with an alarm, so a hang fails instead of blocking.
TEST(UnitTableJson, ATablePathThatIsNotARegularFileIsRefusedWithoutBlocking) {
  const std::string fifo = TempPath("fifo-table.json");
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string dir = TempPath("dir-table.json");
  ::mkdir(dir.c_str(), 0700);
  for (const std::string& path : {fifo, dir}) {
    int rc = testing::InChild([&] {
      ::alarm(20);
      auto c = FindModelConfig(path);
      if (c.ok()) return 1;
      if (c.status().code() != StatusCode::kInvalidArgument) return 2;
      if (std::string(c.status().message()).find(path) == std::string::npos) return 3;
      if (std::string(c.status().message()).find("not a regular file") == std::string::npos) return 4;
      return 0;
    });
    EXPECT_EQ(rc, 0) << path << ": exit code (128 + signal if it crashed; 142: blocked)";
  }
  std::remove(fifo.c_str());
}

// A minimal valid table, then one defect at a time.
const char* kSmall = R"({"name": "small", "image_size": 8, "image_channels": 3, "num_classes": 4,
  "units": [
    {"name": "stem", "kind": "conv", "in_h": 8, "in_w": 8,
     "convs": [{"name": "stem.conv", "in_channels": 3, "out_channels": 8, "kernel": 3, "stride": 2,
                "gelu": true}]},
    {"name": "head", "kind": "classifier", "in_h": 4, "in_w": 4, "width": 8}]})";

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

TEST(UnitTableJson, ASmallTableParsesWithDefaults) {
  auto t = UnitTableFromJson(kSmall, "small.json");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->units.size(), 2u);
  EXPECT_EQ(t->units[0].convs[0].groups, 1);     // default
  EXPECT_EQ(t->units[0].convs[0].padding, -1);   // default: "same"
  EXPECT_EQ(t->units[0].residual, Residual::kNone);
  EXPECT_EQ(t->units[1].kind, TableUnitKind::kClassifier);
}

TEST(UnitTableJson, BadTablesAreInvalidArgumentNamingTheField) {
  struct Case {
    std::string text;
    std::string expect;  // in the message
  };
  const std::string s = kSmall;
  const Case cases[] = {
      {"{", "not valid JSON"},
      {"[]", "not a JSON object"},
      {std::string(100, '[') + std::string(100, ']'), "nest"},
      {Replace(s, "\"stride\": 2", "\"strde\": 2"), "unknown key 'strde'"},
      {Replace(s, "\"stride\": 2", "\"stride\": \"2\""), "'stride' must be an integer"},
      {Replace(s, "\"stride\": 2", "\"stride\": 2.5"), "'stride' must be an integer"},
      {Replace(s, "\"kind\": \"conv\"", "\"kind\": \"pool\""), "'kind' must be"},
      {Replace(s, "\"gelu\": true", "\"gelu\": 1"), "'gelu' must be true or false"},
      {Replace(s, "\"in_channels\": 3", "\"in_channels\": 4"), "stem"},  // does not chain from the image
      {Replace(s, "\"name\": \"small\"", "\"name\": \"\""), "'name'"},
      {Replace(s, "\"units\": [", "\"unitz\": 1, \"units\": ["), "unknown key 'unitz'"},
      {R"({"name": "x", "image_size": 8, "num_classes": 4, "units": []})", "'units'"},
      {Replace(s, "\"kind\": \"classifier\"", "\"kind\": \"classifier\", \"residual\": \"skip\""),
       "'residual' must be"},
  };
  for (const Case& c : cases) {
    auto t = UnitTableFromJson(c.text, "bad.json");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_TRUE(t.status().code() == StatusCode::kInvalidArgument || t.status().code() == StatusCode::kDataLoss)
        << t.status();
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status() << "\n" << c.text;
    EXPECT_NE(t.status().message().find("bad.json"), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace sk
