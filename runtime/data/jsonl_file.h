// A JSONL file of pre-tokenized records for fine-tuning: one JSON object per
// line, with Hugging Face's names:
//   {"input_ids": [1, 5, 9, 2], "labels": [-100, -100, 9, 2]}
//   {"input_ids": [1, 5, 9, 2], "loss_mask": [0, 0, 1, 1]}
//   {"input_ids": [1, 5, 9, 2]}
// "labels" are aligned with "input_ids" as transformers' causal-LM models take
// them (the model shifts them: token j is trained to predict labels[j + 1]);
// -100 (PyTorch's ignore_index) excludes a token, any other value must be a
// token id. "loss_mask" (0 or 1 per token, Megatron's name) says the same as
// labels = input_ids where 1 and -100 where 0; giving both is an error. With
// neither every token is trained. Other keys ("attention_mask", "text", ...)
// are ignored. Blank lines are skipped.
//
// Open reads the file once, one line at a time, validating every record and
// keeping only its byte offset, line number and length (24 bytes a record);
// ReadRecord preads and parses one line again. Memory is therefore bounded
// by the number of records, never by the file's size.
//
// Thread safety: ReadRecord may be called from several threads at once.
#ifndef SHARDKIT_RUNTIME_DATA_JSONL_FILE_H_
#define SHARDKIT_RUNTIME_DATA_JSONL_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace sk {
namespace data {

// The label value that excludes a token (PyTorch's CrossEntropyLoss ignore_index).
inline constexpr int32_t kHfIgnoreLabel = -100;
// The longest line a record may take (a guard against a file that is not
// JSONL at all, such as a binary token file given with the wrong format).
inline constexpr int64_t kMaxJsonlLineBytes = int64_t{64} << 20;

struct TokenRecord {
  std::vector<int32_t> input_ids;
  // One per input id: the token id to predict at this token, or -1 (the
  // runtime's kIgnoreTarget) where excluded.
  std::vector<int32_t> labels;
};

class JsonlFile {
 public:
  // Indexes `path`, checking every record against `vocab`. Errors name the
  // file and the line: NotFound if it cannot be opened; InvalidArgument if it
  // is not a regular file or holds no record; DataLoss if a line is not a
  // JSON object, lacks "input_ids", has a non-integer, negative or >= vocab
  // id, labels or loss_mask of another length or with bad values, both of
  // them, or is longer than kMaxJsonlLineBytes.
  static StatusOr<std::unique_ptr<JsonlFile>> Open(const std::string& path, int64_t vocab);
  ~JsonlFile();
  JsonlFile(const JsonlFile&) = delete;
  JsonlFile& operator=(const JsonlFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_records() const { return static_cast<int64_t>(records_.size()); }
  // Tokens of record `i`.
  int64_t record_length(int64_t i) const { return records_[i].length; }
  // Reads and parses record `i` (0 <= i < num_records()). DataLoss naming the
  // file and line if it changed since Open.
  StatusOr<TokenRecord> ReadRecord(int64_t i) const;

 private:
  struct Entry {
    int64_t offset;
    int64_t line;  // 1-based
    int32_t bytes;
    int32_t length;
  };
  JsonlFile() = default;
  std::string path_;
  int fd_ = -1;
  int64_t vocab_ = 0;
  std::vector<Entry> records_;
};

// Parses one JSONL line into a record; DataLoss naming `where` otherwise.
// What JsonlFile uses; exposed for tests.
StatusOr<TokenRecord> ParseTokenRecord(const std::string& line, int64_t vocab, const std::string& where);

}  // namespace data
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DATA_JSONL_FILE_H_
