#include "runtime/data/dataset.h"

#include <algorithm>
#include <utility>

#include "runtime/data/jsonl_file.h"

namespace sk {
namespace data {
namespace {

constexpr int32_t kIgnore = -1;  // kIgnoreTarget

// Prefix counts: prefix[f] = items in files before f. Which file holds item i.
size_t FileOf(const std::vector<int64_t>& prefix, int64_t i) {
  return static_cast<size_t>(std::upper_bound(prefix.begin(), prefix.end(), i) - prefix.begin()) - 1;
}

// Fixed windows of T + 1 tokens over token files.
class TokenWindows : public Documents {
 public:
  TokenWindows(std::vector<std::unique_ptr<TokenFile>> files, int64_t seq_len)
      : files_(std::move(files)), seq_len_(seq_len) {
    prefix_.push_back(0);
    for (const auto& f : files_) {
      const int64_t windows = f->num_tokens() > seq_len ? (f->num_tokens() - 1) / seq_len : 0;
      prefix_.push_back(prefix_.back() + windows);
    }
  }
  int64_t count() const override { return prefix_.back(); }
  int64_t length(int64_t) const override { return seq_len_ + 1; }
  Status Read(int64_t doc, int64_t begin, int64_t end, int32_t* ids, int32_t* labels) const override {
    const size_t f = FileOf(prefix_, doc);
    SK_RETURN_IF_ERROR(files_[f]->ReadTokens((doc - prefix_[f]) * seq_len_ + begin, end - begin, ids));
    std::copy(ids, ids + (end - begin), labels);
    return OkStatus();
  }

 private:
  std::vector<std::unique_ptr<TokenFile>> files_;
  int64_t seq_len_;
  std::vector<int64_t> prefix_;
};

// Token files split into documents by an EOS token.
class EosDocuments : public Documents {
 public:
  static StatusOr<std::unique_ptr<EosDocuments>> Index(std::vector<std::unique_ptr<TokenFile>> files,
                                                       int32_t eos) {
    std::unique_ptr<EosDocuments> d(new EosDocuments);
    d->files_ = std::move(files);
    d->doc_prefix_.push_back(0);
    constexpr int64_t kChunk = 1 << 18;
    std::vector<int32_t> buf;
    for (const auto& f : d->files_) {
      int64_t start = 0;
      for (int64_t at = 0; at < f->num_tokens(); at += kChunk) {
        const int64_t n = std::min(kChunk, f->num_tokens() - at);
        buf.resize(static_cast<size_t>(n));
        SK_RETURN_IF_ERROR(f->ReadTokens(at, n, buf.data()));
        for (int64_t i = 0; i < n; ++i) {
          if (buf[i] != eos) continue;
          d->docs_.push_back({start, at + i + 1 - start});
          start = at + i + 1;
        }
      }
      if (start < f->num_tokens()) d->docs_.push_back({start, f->num_tokens() - start});
      d->doc_prefix_.push_back(static_cast<int64_t>(d->docs_.size()));
    }
    return d;
  }
  int64_t count() const override { return static_cast<int64_t>(docs_.size()); }
  int64_t length(int64_t doc) const override { return docs_[doc].length; }
  Status Read(int64_t doc, int64_t begin, int64_t end, int32_t* ids, int32_t* labels) const override {
    const size_t f = FileOf(doc_prefix_, doc);
    SK_RETURN_IF_ERROR(files_[f]->ReadTokens(docs_[doc].start + begin, end - begin, ids));
    std::copy(ids, ids + (end - begin), labels);
    return OkStatus();
  }

 private:
  struct Doc {
    int64_t start;
    int64_t length;
  };
  EosDocuments() = default;
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<Doc> docs_;
  std::vector<int64_t> doc_prefix_;
};

// JSONL records, each ended by EOS when one is configured.
class JsonlDocuments : public Documents {
 public:
  JsonlDocuments(std::vector<std::unique_ptr<JsonlFile>> files, int64_t eos)
      : files_(std::move(files)), eos_(eos) {
    prefix_.push_back(0);
    for (const auto& f : files_) prefix_.push_back(prefix_.back() + f->num_records());
  }
  int64_t count() const override { return prefix_.back(); }
  int64_t length(int64_t doc) const override {
    const size_t f = FileOf(prefix_, doc);
    return files_[f]->record_length(doc - prefix_[f]) + (eos_ >= 0 ? 1 : 0);
  }
  Status Read(int64_t doc, int64_t begin, int64_t end, int32_t* ids, int32_t* labels) const override {
    const size_t f = FileOf(prefix_, doc);
    SK_ASSIGN_OR_RETURN(TokenRecord r, files_[f]->ReadRecord(doc - prefix_[f]));
    if (eos_ >= 0) {
      r.input_ids.push_back(static_cast<int32_t>(eos_));
      r.labels.push_back(static_cast<int32_t>(eos_));
    }
    std::copy(r.input_ids.begin() + begin, r.input_ids.begin() + end, ids);
    std::copy(r.labels.begin() + begin, r.labels.begin() + end, labels);
    return OkStatus();
  }

 private:
  std::vector<std::unique_ptr<JsonlFile>> files_;
  int64_t eos_;
  std::vector<int64_t> prefix_;
};

}  // namespace

const char* DatasetFormatName(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kTokens: return "tokens";
    case DatasetFormat::kJsonl: return "jsonl";
  }
  return "unknown";
}

Status ValidateDatasetOptions(const DatasetOptions& o) {
  if (o.paths.empty()) return InvalidArgumentError("dataset: no file given (paths is empty)");
  for (size_t i = 0; i < o.paths.size(); ++i) {
    if (o.paths[i].empty()) return InvalidArgumentError("dataset: paths[" + std::to_string(i) + "] is empty");
  }
  if (o.format != DatasetFormat::kTokens && o.format != DatasetFormat::kJsonl) {
    return InvalidArgumentError("dataset: unknown format " + std::to_string(static_cast<int>(o.format)));
  }
  if (o.layout != TokenFileLayout::kAuto && o.layout != TokenFileLayout::kRaw && o.layout != TokenFileLayout::kLlmc) {
    return InvalidArgumentError("dataset: unknown token file layout " + std::to_string(static_cast<int>(o.layout)));
  }
  if (o.token_bytes != 0 && o.token_bytes != 2 && o.token_bytes != 4) {
    return InvalidArgumentError("dataset: token_bytes must be 2 or 4 (0 = 2 or the llm.c header's), got " +
                                std::to_string(o.token_bytes));
  }
  if (o.eos_id < -1 || o.eos_id > INT32_MAX) {
    return InvalidArgumentError("dataset: eos_id must be a token id or -1 (none), got " + std::to_string(o.eos_id));
  }
  if (o.packing && o.format == DatasetFormat::kTokens && o.eos_id < 0) {
    return InvalidArgumentError(
        "dataset: packing a token file needs eos_id (the token that ends its documents); without it the "
        "file is read in fixed windows, which are full rows already");
  }
  return OkStatus();
}

Dataset::Dataset(const DatasetOptions& options, int64_t seq_len, std::unique_ptr<Documents> docs)
    : options_(options),
      seq_len_(seq_len),
      docs_(std::move(docs)),
      order_(std::max<int64_t>(docs_->count(), 1), options.seed, options.shuffle) {
  pad_id_ = options.eos_id >= 0 ? static_cast<int32_t>(options.eos_id) : 0;
  if (options.packing) {
    int64_t total = 0;
    for (int64_t d = 0; d < docs_->count(); ++d) total += docs_->length(d);
    num_samples_ = (total + seq_len - 1) / seq_len;
  } else {
    num_samples_ = docs_->count();
  }
}

StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetOptions& options, int64_t seq_len, int64_t vocab) {
  SK_RETURN_IF_ERROR(ValidateDatasetOptions(options));
  if (seq_len <= 0) return InvalidArgumentError("dataset: seq_len must be positive, got " + std::to_string(seq_len));
  if (vocab <= 0 || vocab > INT32_MAX) {
    return InvalidArgumentError("dataset: vocab must be in [1, 2^31), got " + std::to_string(vocab));
  }
  if (options.eos_id >= vocab) {
    return InvalidArgumentError("dataset: eos_id " + std::to_string(options.eos_id) + " is outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
  }
  std::unique_ptr<Documents> docs;
  if (options.format == DatasetFormat::kTokens) {
    std::vector<std::unique_ptr<TokenFile>> files;
    for (const std::string& p : options.paths) {
      SK_ASSIGN_OR_RETURN(std::unique_ptr<TokenFile> f, TokenFile::Open(p, options.layout, options.token_bytes, vocab));
      files.push_back(std::move(f));
    }
    if (options.eos_id >= 0) {
      SK_ASSIGN_OR_RETURN(docs, EosDocuments::Index(std::move(files), static_cast<int32_t>(options.eos_id)));
    } else {
      docs = std::make_unique<TokenWindows>(std::move(files), seq_len);
    }
  } else {
    std::vector<std::unique_ptr<JsonlFile>> files;
    for (const std::string& p : options.paths) {
      SK_ASSIGN_OR_RETURN(std::unique_ptr<JsonlFile> f, JsonlFile::Open(p, vocab));
      files.push_back(std::move(f));
    }
    docs = std::make_unique<JsonlDocuments>(std::move(files), options.eos_id);
  }
  if (docs->count() == 0) {
    return InvalidArgumentError("dataset: no sample: every token file is shorter than one window of seq_len + 1 = " +
                                std::to_string(seq_len + 1) + " tokens");
  }
  return std::unique_ptr<Dataset>(new Dataset(options, seq_len, std::move(docs)));
}

std::shared_ptr<const std::vector<int64_t>> Dataset::PackedOffsets(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : offsets_cache_) {
      if (e.first == epoch) return e.second;
    }
  }
  auto offsets = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(docs_->count()) + 1);
  for (int64_t k = 0; k < docs_->count(); ++k) {
    (*offsets)[k + 1] = (*offsets)[k] + docs_->length(order_.At(epoch, k));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (offsets_cache_.size() >= 2) offsets_cache_.erase(offsets_cache_.begin());
  offsets_cache_.emplace_back(epoch, offsets);
  return offsets;
}

Status Dataset::FillUnpacked(int64_t epoch, int64_t position, int64_t row, TokenBatch& b, int64_t* id) const {
  const int64_t T = seq_len_;
  const int64_t doc = order_.At(epoch, position);
  *id = doc;
  const int64_t k = std::min(docs_->length(doc), T + 1);
  std::vector<int32_t> ids(static_cast<size_t>(k)), labels(static_cast<size_t>(k));
  SK_RETURN_IF_ERROR(docs_->Read(doc, 0, k, ids.data(), labels.data()));
  int32_t* in = b.inputs.data() + row * T;
  int32_t* tg = b.targets.data() + row * T;
  for (int64_t j = 0; j < T; ++j) {
    in[j] = j < k ? ids[j] : pad_id_;
    tg[j] = j + 1 < k ? labels[j + 1] : kIgnore;
  }
  return OkStatus();
}

Status Dataset::FillPacked(int64_t epoch, int64_t position, int64_t row, TokenBatch& b, int64_t* id) const {
  const int64_t T = seq_len_;
  const std::shared_ptr<const std::vector<int64_t>> offsets = PackedOffsets(epoch);
  const std::vector<int64_t>& off = *offsets;
  const int64_t row_begin = position * T, row_end = std::min(row_begin + T, off.back());
  int32_t* in = b.inputs.data() + row * T;
  int32_t* tg = b.targets.data() + row * T;
  int32_t* pos = b.positions.data() + row * T;
  int32_t* seg = b.segment_ids.data() + row * T;
  int64_t k = static_cast<int64_t>(std::upper_bound(off.begin(), off.end(), row_begin) - off.begin()) - 1;
  *id = order_.At(epoch, k);
  int64_t j = 0;
  int32_t s = 0;
  std::vector<int32_t> ids, labels;
  for (int64_t p = row_begin; p < row_end; ++k, ++s) {
    const int64_t doc = order_.At(epoch, k);
    const int64_t o = p - off[k];
    const int64_t run = std::min(off[k + 1], row_end) - p;
    // The document goes on past the row: its next token is this run's last target.
    const int64_t extra = off[k + 1] > row_end ? 1 : 0;
    ids.resize(static_cast<size_t>(run + extra));
    labels.resize(ids.size());
    SK_RETURN_IF_ERROR(docs_->Read(doc, o, o + run + extra, ids.data(), labels.data()));
    for (int64_t q = 0; q < run; ++q, ++j) {
      in[j] = ids[q];
      tg[j] = q + 1 < run + extra ? labels[q + 1] : kIgnore;
      pos[j] = static_cast<int32_t>(q);
      seg[j] = s;
    }
    p += run;
  }
  for (int64_t q = 0; j < T; ++j, ++q) {
    in[j] = pad_id_;
    tg[j] = kIgnore;
    pos[j] = static_cast<int32_t>(q);
    seg[j] = s;
  }
  return OkStatus();
}

StatusOr<TokenBatch> Dataset::Rows(int64_t first, int64_t count, std::vector<int64_t>* sample_ids,
                                   bool one_pass) const {
  if (first < 0 || count <= 0) {
    return InvalidArgumentError("dataset: rows need first >= 0 and count > 0, got first " + std::to_string(first) +
                                ", count " + std::to_string(count));
  }
  if (count > (int64_t{1} << 34) / seq_len_) {
    return InvalidArgumentError("dataset: " + std::to_string(count) + " rows of " + std::to_string(seq_len_) +
                                " tokens are too many for one batch");
  }
  const int64_t T = seq_len_;
  TokenBatch b;
  b.batch_size = count;
  b.seq_len = T;
  b.inputs.assign(static_cast<size_t>(count * T), pad_id_);
  b.targets.assign(static_cast<size_t>(count * T), kIgnore);
  if (options_.packing) {
    b.positions.assign(static_cast<size_t>(count * T), 0);
    b.segment_ids.assign(static_cast<size_t>(count * T), 0);
  }
  std::vector<int64_t> ids(static_cast<size_t>(count), -1);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t n = first + r;
    if (one_pass && n >= num_samples_) {
      for (int64_t j = 0; options_.packing && j < T; ++j) b.positions[r * T + j] = static_cast<int32_t>(j);
      continue;
    }
    const int64_t epoch = n / num_samples_, position = n % num_samples_;
    SK_RETURN_IF_ERROR(options_.packing ? FillPacked(epoch, position, r, b, &ids[r])
                                        : FillUnpacked(epoch, position, r, b, &ids[r]));
  }
  if (sample_ids != nullptr) *sample_ids = std::move(ids);
  return b;
}

}  // namespace data
}  // namespace sk
