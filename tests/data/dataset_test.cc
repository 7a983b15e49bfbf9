#include "runtime/data/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/data/jsonl_file.h"
#include "runtime/data/sample_order.h"
#include "runtime/data/token_file.h"
#include "tests/data/data_files.h"

namespace sk {
namespace data {
namespace {

using testing::DataTempPath;
using testing::JsonlRecord;
using testing::WriteText;
using testing::WriteTokens;

bool Mentions(const Status& s, const std::string& what) {
  return std::string(s.message()).find(what) != std::string::npos;
}

// ---- SampleOrder -----------------------------------------------------------

TEST(SampleOrder, EachEpochVisitsEverySampleOnce) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    SampleOrder order(n, 42, /*shuffle=*/true);
    for (int64_t epoch : {0, 1, 5}) {
      std::vector<int64_t> seen;
      for (int64_t i = 0; i < n; ++i) seen.push_back(order.At(epoch, i));
      std::sort(seen.begin(), seen.end());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], i) << "n " << n << " epoch " << epoch;
    }
  }
}

TEST(SampleOrder, IsAFunctionOfSeedEpochAndPosition) {
  SampleOrder a(1000, 7, true), b(1000, 7, true), other_seed(1000, 8, true);
  int differ_epoch = 0, differ_seed = 0, moved = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.At(3, i), b.At(3, i));
    differ_epoch += a.At(0, i) != a.At(1, i);
    differ_seed += a.At(0, i) != other_seed.At(0, i);
    moved += a.At(0, i) != i;
  }
  // A random permutation of 1000 keeps about one element in place.
  EXPECT_GT(differ_epoch, 900);
  EXPECT_GT(differ_seed, 900);
  EXPECT_GT(moved, 900);
}

TEST(SampleOrder, WithoutShuffleIsTheIdentity) {
  SampleOrder order(50, 7, /*shuffle=*/false);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(order.At(4, i), i);
}

// ---- TokenFile -------------------------------------------------------------

TEST(TokenFile, ReadsRawUint16AndUint32Ranges) {
  const std::string p16 = DataTempPath("raw16.bin"), p32 = DataTempPath("raw32.bin");
  WriteTokens(p16, {1, 0x1234, 255, 7}, 2);
  WriteTokens(p32, {2, 0x10000, 9}, 4);
  auto f16 = TokenFile::Open(p16, TokenFileLayout::kAuto, 0, 0x10000);
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_EQ((*f16)->layout(), TokenFileLayout::kRaw);
  EXPECT_EQ((*f16)->num_tokens(), 4);
  std::vector<int32_t> out(2);
  ASSERT_TRUE((*f16)->ReadTokens(1, 2, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0x1234, 255}));
  auto f32 = TokenFile::Open(p32, TokenFileLayout::kRaw, 4, 0x20000);
  ASSERT_TRUE(f32.ok()) << f32.status();
  out.resize(3);
  ASSERT_TRUE((*f32)->ReadTokens(0, 3, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{2, 0x10000, 9}));
  EXPECT_EQ((*f32)->ReadTokens(2, 2, out.data()).code(), StatusCode::kOutOfRange);
}

TEST(TokenFile, DetectsLlmcHeadersOfBothWidths) {
  const std::string gpt2 = DataTempPath("llmc-gpt2.bin"), llama = DataTempPath("llmc-llama.bin");
  WriteTokens(gpt2, {5, 6, 50256}, 2, kLlmcMagicUint16, 1);
  WriteTokens(llama, {128000, 3}, 4, kLlmcMagicUint32, 7);
  auto a = TokenFile::Open(gpt2, TokenFileLayout::kAuto, 0, 50257);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->layout(), TokenFileLayout::kLlmc);
  EXPECT_EQ((*a)->token_bytes(), 2);
  std::vector<int32_t> out(3);
  ASSERT_TRUE((*a)->ReadTokens(0, 3, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{5, 6, 50256}));
  auto b = TokenFile::Open(llama, TokenFileLayout::kLlmc, 0, 128256);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->token_bytes(), 4);
  out.resize(2);
  ASSERT_TRUE((*b)->ReadTokens(0, 2, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{128000, 3}));
  // The raw layout reads the header as tokens: the caller's choice.
  auto raw = TokenFile::Open(gpt2, TokenFileLayout::kRaw, 2, 65536);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ((*raw)->num_tokens(), 512 + 3);
}

TEST(TokenFile, BadFilesAreClearErrorsNamingTheFile) {
  const std::string dir = DataTempPath("");
  auto missing = TokenFile::Open(DataTempPath("no-such.bin"), TokenFileLayout::kAuto, 0, 100);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(missing.status(), "no-such.bin"));
  EXPECT_EQ(TokenFile::Open(dir, TokenFileLayout::kAuto, 0, 100).status().code(), StatusCode::kInvalidArgument);

  const std::string odd = DataTempPath("odd.bin");
  WriteText(odd, std::string(5, '\1'));
  auto o = TokenFile::Open(odd, TokenFileLayout::kAuto, 2, 1000);
  EXPECT_EQ(o.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(o.status(), "odd.bin") && Mentions(o.status(), "not a multiple")) << o.status();

  const std::string truncated = DataTempPath("truncated.bin");
  WriteTokens(truncated, {1, 2, 3}, 2, kLlmcMagicUint16, 1, /*header_count=*/10);
  auto t = TokenFile::Open(truncated, TokenFileLayout::kAuto, 0, 1000);
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(t.status(), "truncated.bin") && Mentions(t.status(), "(truncated)")) << t.status();

  const std::string version = DataTempPath("version.bin");
  WriteTokens(version, {1, 2}, 2, kLlmcMagicUint16, 3);
  auto v = TokenFile::Open(version, TokenFileLayout::kAuto, 0, 1000);
  EXPECT_EQ(v.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(v.status(), "version is 3")) << v.status();

  const std::string headerless = DataTempPath("headerless.bin");
  WriteTokens(headerless, std::vector<uint32_t>(600, 1), 2);
  auto h = TokenFile::Open(headerless, TokenFileLayout::kLlmc, 0, 1000);
  EXPECT_EQ(h.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(h.status(), "magic")) << h.status();

  const std::string gpt2 = DataTempPath("width.bin");
  WriteTokens(gpt2, {1, 2}, 2, kLlmcMagicUint16, 1);
  auto w = TokenFile::Open(gpt2, TokenFileLayout::kAuto, 4, 1000);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(w.status(), "header says 2-byte")) << w.status();

  const std::string big = DataTempPath("big-token.bin");
  WriteTokens(big, {1, 2, 900, 3}, 2);
  auto f = TokenFile::Open(big, TokenFileLayout::kAuto, 0, 500);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<int32_t> out(4);
  Status s = (*f)->ReadTokens(0, 4, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "big-token.bin") && Mentions(s, "token 2 (byte 4) is 900")) << s;

  const std::string empty = DataTempPath("empty.bin");
  WriteText(empty, "");
  EXPECT_EQ(TokenFile::Open(empty, TokenFileLayout::kAuto, 0, 100).status().code(), StatusCode::kInvalidArgument);
}

// A 64 GiB token file (sparse: no disk blocks) opens and serves a window
// from its end without being read: memory is what the caller reads.
TEST(TokenFile, AHugeFileIsNeverReadWhole) {
  const std::string path = DataTempPath("huge.bin");
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  const int64_t bytes = int64_t{64} << 30;
  if (::ftruncate(fd, bytes) != 0) {
    ::close(fd);
    GTEST_SKIP() << "the test filesystem cannot hold a sparse 64 GiB file";
  }
  ::close(fd);
  DatasetOptions o;
  o.paths = {path};
  auto ds = Dataset::Open(o, /*seq_len=*/16, /*vocab=*/100);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_samples(), (bytes / 2 - 1) / 16);
  std::vector<int64_t> ids;
  auto rows = (*ds)->Rows((*ds)->num_samples() - 1, 1, &ids);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->inputs, std::vector<int32_t>(16, 0));
  ::unlink(path.c_str());
}

// ---- JSONL -----------------------------------------------------------------

TEST(JsonlFile, ReadsLabelsAndLossMasksWithHuggingFaceNames) {
  const std::string path = DataTempPath("records.jsonl");
  WriteText(path, JsonlRecord({1, 2, 3}, {-100, 2, 3}) + "\n   \n" +
                      "{\"input_ids\": [4, 5], \"loss_mask\": [1, 0], \"attention_mask\": [1, 1]}\n" +
                      "{\"input_ids\": [6]}");
  auto f = JsonlFile::Open(path, 10);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->num_records(), 3);
  auto a = (*f)->ReadRecord(0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(a->labels, (std::vector<int32_t>{-1, 2, 3}));
  auto b = (*f)->ReadRecord(1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->labels, (std::vector<int32_t>{4, -1}));
  auto c = (*f)->ReadRecord(2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->labels, (std::vector<int32_t>{6}));
}

TEST(JsonlFile, MalformedRecordsNameTheFileAndLine) {
  struct Case {
    std::string bad_line;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"{\"input_ids\": [1, 2", "not valid JSON"},
      {"[1, 2, 3]", "not a JSON object"},
      {"{\"tokens\": [1]}", "no \"input_ids\""},
      {"{\"input_ids\": [1, 2.5]}", "not an integer"},
      {"{\"input_ids\": [1, 99]}", "input_ids[1] is 99"},
      {"{\"input_ids\": [1, 2], \"labels\": [1]}", "\"labels\" has 1 entries"},
      {"{\"input_ids\": [1, 2], \"labels\": [-5, 2]}", "neither -100"},
      {"{\"input_ids\": [1, 2], \"loss_mask\": [2, 0]}", "not 0 or 1"},
      {"{\"input_ids\": [1], \"labels\": [1], \"loss_mask\": [1]}", "both"},
      {"{\"input_ids\": []}", "empty"},
  };
  for (const Case& c : cases) {
    const std::string path = DataTempPath("bad.jsonl");
    WriteText(path, JsonlRecord({1, 2}) + "\n" + c.bad_line + "\n");
    auto f = JsonlFile::Open(path, 10);
    ASSERT_FALSE(f.ok()) << c.bad_line;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status();
    EXPECT_TRUE(Mentions(f.status(), "bad.jsonl' line 3") && Mentions(f.status(), c.says)) << f.status();
  }
  const std::string none = DataTempPath("none.jsonl");
  WriteText(none, "\n\n");
  EXPECT_EQ(JsonlFile::Open(none, 10).status().code(), StatusCode::kInvalidArgument);
}

// ---- Dataset: fixed windows ------------------------------------------------

std::vector<uint32_t> Iota(int n, int start = 0) {
  std::vector<uint32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(start + i);
  return v;
}

TEST(Dataset, FixedWindowsCoverTheFilesWithoutOverlapAndShuffleByEpoch) {
  // Two shards: 41 tokens (5 windows of 8 + 1) and 20 tokens (2 windows).
  const std::string a = DataTempPath("shard-a.bin"), b = DataTempPath("shard-b.bin");
  WriteTokens(a, Iota(41), 2);
  WriteTokens(b, Iota(20, 100), 2);
  DatasetOptions o;
  o.paths = {a, b};
  o.seed = 3;
  auto ds = Dataset::Open(o, 8, 1000);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_samples(), 7);
  std::vector<int64_t> ids;
  auto rows = (*ds)->Rows(0, 14, &ids);  // two epochs
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(rows->positions.empty() && rows->segment_ids.empty());
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen(ids.begin() + 7 * epoch, ids.begin() + 7 * epoch + 7);
    EXPECT_EQ(seen.size(), 7u);
  }
  EXPECT_NE(std::vector<int64_t>(ids.begin(), ids.begin() + 7), std::vector<int64_t>(ids.begin() + 7, ids.end()));
  for (int r = 0; r < 14; ++r) {
    const int64_t w = ids[r];
    const int32_t first = w < 5 ? static_cast<int32_t>(8 * w) : static_cast<int32_t>(100 + 8 * (w - 5));
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(rows->inputs[r * 8 + j], first + j);
      EXPECT_EQ(rows->targets[r * 8 + j], first + j + 1);
    }
  }
  // Any slice equals the same rows of a larger request (no state, no replay).
  std::vector<int64_t> slice_ids;
  auto slice = (*ds)->Rows(9, 3, &slice_ids);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(slice_ids, std::vector<int64_t>(ids.begin() + 9, ids.begin() + 12));
  EXPECT_EQ(slice->inputs, std::vector<int32_t>(rows->inputs.begin() + 72, rows->inputs.begin() + 96));
}

TEST(Dataset, OnePassPadsPastTheEndWithIgnoredRows) {
  const std::string a = DataTempPath("eval.bin");
  WriteTokens(a, Iota(17), 2);
  DatasetOptions o;
  o.paths = {a};
  o.shuffle = false;
  auto ds = Dataset::Open(o, 8, 100);
  ASSERT_TRUE(ds.ok());
  std::vector<int64_t> ids;
  auto rows = (*ds)->Rows(1, 2, &ids, /*one_pass=*/true);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(ids, (std::vector<int64_t>{1, -1}));
  EXPECT_EQ(rows->targets[7], 16);
  for (int j = 8; j < 16; ++j) EXPECT_EQ(rows->targets[j], kIgnoreTarget);
}

// ---- Dataset: documents ----------------------------------------------------

TEST(Dataset, UnpackedRecordsShiftLabelsPadAndTruncate) {
  const std::string path = DataTempPath("sft.jsonl");
  // Prompt tokens 1 2 masked, response 3 4; a long record; a one-token record.
  WriteText(path, JsonlRecord({1, 2, 3, 4}, {-100, -100, 3, 4}) + JsonlRecord({10, 11, 12, 13, 14, 15, 16, 17, 18}) +
                      JsonlRecord({7}));
  DatasetOptions o;
  o.paths = {path};
  o.format = DatasetFormat::kJsonl;
  o.shuffle = false;
  o.eos_id = 0;
  auto ds = Dataset::Open(o, 6, 50);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto rows = (*ds)->Rows(0, 3, nullptr);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const int I = kIgnoreTarget;
  // Record 0 + EOS: inputs 1 2 3 4 0, pad 0; token 1 predicts label[2] = 3.
  EXPECT_EQ(std::vector<int32_t>(rows->inputs.begin(), rows->inputs.begin() + 6), (std::vector<int32_t>{1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(rows->targets.begin(), rows->targets.begin() + 6), (std::vector<int32_t>{I, 3, 4, 0, I, I}));
  // Record 1 (9 tokens + EOS) is truncated to 7 tokens.
  EXPECT_EQ(std::vector<int32_t>(rows->inputs.begin() + 6, rows->inputs.begin() + 12), (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(std::vector<int32_t>(rows->targets.begin() + 6, rows->targets.begin() + 12), (std::vector<int32_t>{11, 12, 13, 14, 15, 16}));
  EXPECT_EQ(std::vector<int32_t>(rows->targets.begin() + 12, rows->targets.end()), (std::vector<int32_t>{0, I, I, I, I, I}));
}

// Rebuilds every document's tokens from packed rows, checking the row
// invariants on the way.
void CheckPackedEpoch(const Dataset& ds, int64_t epoch, const std::vector<std::vector<int32_t>>& docs) {
  const int64_t T = ds.seq_len(), S = ds.num_samples();
  std::vector<int64_t> ids;
  auto rows = ds.Rows(epoch * S, S, &ids);
  ASSERT_TRUE(rows.ok()) << rows.status();
  std::vector<int32_t> stream, targets;
  int64_t tokens = 0;
  for (const auto& d : docs) tokens += static_cast<int64_t>(d.size());
  for (int64_t r = 0; r < S; ++r) {
    for (int64_t j = 0; j < T; ++j) {
      const int64_t k = r * T + j;
      if (j > 0) {
        ASSERT_GE(rows->segment_ids[k], rows->segment_ids[k - 1]);
        if (rows->segment_ids[k] == rows->segment_ids[k - 1]) {
          ASSERT_EQ(rows->positions[k], rows->positions[k - 1] + 1);
          // Within a document, a token's target is the next input.
          ASSERT_EQ(rows->targets[k - 1], rows->inputs[k]);
        } else {
          ASSERT_EQ(rows->positions[k], 0);
          ASSERT_EQ(rows->targets[k - 1], kIgnoreTarget) << "a target crossed a document boundary";
        }
      } else {
        ASSERT_EQ(rows->positions[k], 0);
        ASSERT_EQ(rows->segment_ids[k], 0);
      }
      if (r * T + j < tokens) stream.push_back(rows->inputs[k]);
      else ASSERT_EQ(rows->targets[k], kIgnoreTarget);
    }
  }
  // The rows' real tokens are every document's tokens once.
  std::vector<int32_t> sorted_stream = stream, all;
  for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  std::sort(sorted_stream.begin(), sorted_stream.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(sorted_stream, all);
}

TEST(Dataset, PackingConcatenatesEachEpochsDocumentsIntoRowsWithBoundaries) {
  // Documents ended by EOS = 0 in a token file: lengths 3, 5, 2, 9, 4, 1.
  std::vector<std::vector<int32_t>> docs = {{11, 12, 0}, {21, 22, 23, 24, 0}, {31, 0},
                                           {41, 42, 43, 44, 45, 46, 47, 48, 0}, {51, 52, 53, 0}, {61}};
  std::vector<uint32_t> flat;
  for (const auto& d : docs) flat.insert(flat.end(), d.begin(), d.end());
  const std::string path = DataTempPath("docs.bin");
  WriteTokens(path, flat, 4);
  DatasetOptions o;
  o.paths = {path};
  o.token_bytes = 4;
  o.eos_id = 0;
  o.packing = true;
  o.seed = 11;
  auto ds = Dataset::Open(o, 5, 100);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 6);
  EXPECT_EQ((*ds)->num_samples(), 5);  // 24 tokens in rows of 5
  for (int64_t epoch = 0; epoch < 3; ++epoch) CheckPackedEpoch(**ds, epoch, docs);
  auto e0 = (*ds)->Rows(0, 5, nullptr), e1 = (*ds)->Rows(5, 5, nullptr);
  ASSERT_TRUE(e0.ok() && e1.ok());
  EXPECT_NE(e0->inputs, e1->inputs) << "epochs should pack documents in different orders";
}

TEST(Dataset, PackedJsonlKeepsMasksAndMasksAcrossBoundaries) {
  const std::string path = DataTempPath("packed.jsonl");
  WriteText(path, JsonlRecord({1, 2, 3}, {-100, 2, 3}) + JsonlRecord({4, 5}, {-100, 5}));
  DatasetOptions o;
  o.paths = {path};
  o.format = DatasetFormat::kJsonl;
  o.shuffle = false;
  o.packing = true;
  auto ds = Dataset::Open(o, 4, 10);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_samples(), 2);
  auto rows = (*ds)->Rows(0, 2, nullptr);
  ASSERT_TRUE(rows.ok());
  const int I = kIgnoreTarget;
  EXPECT_EQ(rows->inputs, (std::vector<int32_t>{1, 2, 3, 4, 5, 0, 0, 0}));
  // Record 1's first token (label -100) still predicts its second (label 5),
  // across the row boundary; the second ends the record.
  EXPECT_EQ(rows->targets, (std::vector<int32_t>{2, 3, I, 5, I, I, I, I}));
  EXPECT_EQ(rows->segment_ids, (std::vector<int32_t>{0, 0, 0, 1, 0, 1, 1, 1}));
  EXPECT_EQ(rows->positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 0, 1, 2}));
}

TEST(Dataset, BadOptionsAreRefusedNamingTheField) {
  const std::string path = DataTempPath("opts.bin");
  WriteTokens(path, Iota(40), 2);
  DatasetOptions o;
  EXPECT_TRUE(Mentions(Dataset::Open(o, 8, 100).status(), "paths"));
  o.paths = {path};
  o.packing = true;
  EXPECT_TRUE(Mentions(Dataset::Open(o, 8, 100).status(), "eos_id"));
  o.packing = false;
  o.token_bytes = 3;
  EXPECT_TRUE(Mentions(Dataset::Open(o, 8, 100).status(), "token_bytes"));
  o.token_bytes = 0;
  o.eos_id = 100;
  EXPECT_TRUE(Mentions(Dataset::Open(o, 8, 100).status(), "eos_id 100"));
  o.eos_id = -1;
  EXPECT_TRUE(Mentions(Dataset::Open(o, 40, 100).status(), "shorter than one window"));
  auto ok = Dataset::Open(o, 8, 100);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->Rows(-1, 1, nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace data
}  // namespace sk
