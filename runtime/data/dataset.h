// Datasets shardkit reads itself, cut into training rows in an order that
// depends only on the global sample index (docs/data.md).
//
// Documents. A dataset is a list of documents, numbered across its files in
// the order given:
//   - a token file (token_file.h) without eos_id: fixed windows. Document i
//     of a file is its tokens [i * T, i * T + T + 1) (T = seq_len: T inputs
//     and their T next-token targets; windows do not overlap except in the
//     one target token, and never cross files; a tail shorter than a window
//     is dropped);
//   - a token file with eos_id: the documents the EOS token ends (each keeps
//     its EOS; a last one without EOS ends at the end of the file). Open
//     scans the files once, in 1 MiB reads (checking every token against
//     the vocabulary), keeping 16 bytes a document;
//   - JSONL records (jsonl_file.h), each a document with its labels; with
//     eos_id an EOS token (trained) ends every record.
//
// Samples and order. Without packing a sample is one document; with packing
// a sample is one row of the epoch's packed stream (below). Samples are
// numbered 0..S-1; the global sample index n (samples consumed before it, over
// all epochs) is in epoch e = n / S at position n % S, and epoch e visits
// documents in the order of SampleOrder(seed, e) (sample_order.h). A trainer's
// step t takes G = batch x grad_accum x world consecutive global indices and
// rank r the r-th slice of them, so the data position is one integer, and a
// resume at another world size with the same G continues the same order.
//
// Rows. A row holds T input tokens and their T targets (the next token of the
// same document, or -1, kIgnoreTarget, where the label is masked, at the last
// token of a document and on padding).
//   - unpacked: the document's first T + 1 tokens (a longer one is truncated:
//     its tail is never seen), padded with pad tokens whose targets are -1;
//     no positions or segment ids (padding sits after every real token, and
//     causal attention never looks forward);
//   - packed: the epoch's documents in order are concatenated into one stream
//     and cut into rows of T tokens (the last row padded). A row carries
//     segment_ids (0, 1, ... for each document or piece of one, and one more
//     for the padding) and positions that restart at 0 at each document start
//     and at the row start (a document continued from the previous row starts
//     again at 0, as an independent sequence). A token's target never crosses
//     a document boundary; it does cross a row boundary (the last token of a
//     row predicts the next row's first token of the same document). Finding a
//     row needs the epoch's cumulative document lengths: 8 bytes a document,
//     built once per epoch (the two latest epochs are kept).
//
// Memory is bounded by the number of documents (the indexes above) and the
// rows asked for; file contents are read with pread, only for those rows.
//
// Thread safety: Rows may be called from several threads at once.
#ifndef SHARDKIT_RUNTIME_DATA_DATASET_H_
#define SHARDKIT_RUNTIME_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/data/sample_order.h"
#include "runtime/data/token_file.h"
#include "runtime/nn/model.h"

namespace sk {
namespace data {

enum class DatasetFormat : int { kTokens = 1, kJsonl = 2 };

// "tokens", "jsonl".
const char* DatasetFormatName(DatasetFormat format);

struct DatasetOptions {
  // The files, read in this order as one dataset (shards).
  std::vector<std::string> paths;
  DatasetFormat format = DatasetFormat::kTokens;
  // Token files only: the layout and the width (0 = 2 bytes, or the llm.c
  // header's).
  TokenFileLayout layout = TokenFileLayout::kAuto;
  int token_bytes = 0;
  uint64_t seed = 1;
  bool shuffle = true;
  bool packing = false;
  // The end-of-sequence token, or -1 for none: splits a token file into
  // documents, ends each JSONL record, and is the pad token (else 0).
  int64_t eos_id = -1;
};

// InvalidArgument naming the field.
Status ValidateDatasetOptions(const DatasetOptions& options);

// The documents of a dataset (see above); implemented per format.
class Documents {
 public:
  virtual ~Documents() = default;
  virtual int64_t count() const = 0;
  virtual int64_t length(int64_t doc) const = 0;
  // Tokens [begin, end) of document `doc`: ids and their labels (the id to
  // predict at that token, -1 where masked).
  virtual Status Read(int64_t doc, int64_t begin, int64_t end, int32_t* ids, int32_t* labels) const = 0;
};

class Dataset {
 public:
  // Opens and indexes the files for rows of `seq_len` tokens of a model with
  // `vocab` tokens. Errors name the file and where in it (token_file.h,
  // jsonl_file.h); InvalidArgument for bad options (packing a token file
  // needs eos_id) or a dataset with no sample (every token file shorter than
  // one window).
  static StatusOr<std::unique_ptr<Dataset>> Open(const DatasetOptions& options, int64_t seq_len, int64_t vocab);

  const DatasetOptions& options() const { return options_; }
  int64_t seq_len() const { return seq_len_; }
  // Samples per epoch (S).
  int64_t num_samples() const { return num_samples_; }
  int64_t num_documents() const { return docs_->count(); }

  // Rows for global samples [first, first + count) (first >= 0), as a
  // TokenBatch of `count` rows, and in `sample_ids` (if not null) one id per
  // row: the document it holds (unpacked) or the document its first token
  // belongs to (packed). With `one_pass` the samples are not wrapped into
  // later epochs: indices >= num_samples() give rows whose every target is
  // -1 and id -1 (an evaluation set's tail). Errors: the files' (a token
  // outside the vocabulary, a short read).
  StatusOr<TokenBatch> Rows(int64_t first, int64_t count, std::vector<int64_t>* sample_ids,
                            bool one_pass = false) const;

 private:
  Dataset(const DatasetOptions& options, int64_t seq_len, std::unique_ptr<Documents> docs);
  // Writes row `row` (inputs, targets, positions, segment ids) of sample n.
  Status FillUnpacked(int64_t epoch, int64_t position, int64_t row, TokenBatch& b, int64_t* id) const;
  Status FillPacked(int64_t epoch, int64_t position, int64_t row, TokenBatch& b, int64_t* id) const;
  // The cumulative document lengths of `epoch`'s order (size count() + 1).
  std::shared_ptr<const std::vector<int64_t>> PackedOffsets(int64_t epoch) const;

  DatasetOptions options_;
  int64_t seq_len_;
  std::unique_ptr<Documents> docs_;
  SampleOrder order_;
  int64_t num_samples_ = 0;
  int32_t pad_id_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>> offsets_cache_;
};

}  // namespace data
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DATA_DATASET_H_
