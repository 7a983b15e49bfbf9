// Report tables: the rows every paper harness measures, written as CSV, JSON
// and an aligned console table from one definition so they cannot disagree.
//
// A Row is an ordered list of (column, cell); a cell is a number or text. A
// Table's columns are the union of its rows' columns in first-seen order, so
// a row that lacks a column (a configuration that ran out of memory has no
// step time) leaves that cell empty in CSV and null in JSON.
//
// Thread safety: none; build tables on one thread.
#ifndef SHARDKIT_BENCHMARKS_PAPER_REPORT_H_
#define SHARDKIT_BENCHMARKS_PAPER_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/status.h"

namespace sk::bench {

struct Cell {
  bool is_number = false;
  double number = 0;
  std::string text;
  // Digits after the point when printed (numbers only); -1 = shortest form.
  int precision = -1;

  // The cell as CSV and console show it: numbers with `precision` digits, or
  // the shortest round-trip form for -1 (integers print without a point).
  std::string ToString() const;
};

class Row {
 public:
  Row& Set(const std::string& column, const std::string& text);
  Row& Set(const std::string& column, const char* text) { return Set(column, std::string(text)); }
  Row& Set(const std::string& column, double number, int precision = -1);
  Row& Set(const std::string& column, int64_t number);
  Row& Set(const std::string& column, int number) { return Set(column, static_cast<int64_t>(number)); }

  // Null when the row has no such column.
  const Cell* Find(const std::string& column) const;
  // The number in `column`, or `fallback` when absent or text.
  double Number(const std::string& column, double fallback = 0) const;
  // The text of `column` (numbers as ToString), or "" when absent.
  std::string Text(const std::string& column) const;
  const std::vector<std::pair<std::string, Cell>>& cells() const { return cells_; }

 private:
  std::vector<std::pair<std::string, Cell>> cells_;
};

class Table {
 public:
  explicit Table(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void Add(Row row) { rows_.push_back(std::move(row)); }
  const std::vector<Row>& rows() const { return rows_; }
  std::vector<std::string> Columns() const;

  // RFC 4180: a header line, then one line per row; fields holding a comma,
  // quote or newline are quoted with quotes doubled. Lines end in "\n".
  std::string ToCsv() const;
  // {"table": name, "columns": [...], "rows": [{column: value-or-null}, ...]}
  // with numbers as JSON numbers (non-finite ones as null).
  std::string ToJson() const;
  // Aligned columns for the console; only `columns` when not empty.
  std::string ToText(const std::vector<std::string>& columns = {}) const;
  // GitHub-flavoured Markdown table of `columns` (all when empty).
  std::string ToMarkdown(const std::vector<std::string>& columns = {}) const;

  // Writes <dir>/<name>.csv and <dir>/<name>.json. Unavailable naming the
  // file on I/O failure.
  Status WriteFiles(const std::string& dir) const;

 private:
  std::string name_;
  std::vector<Row> rows_;
};

// Writes `contents` to `path` (truncating). Unavailable naming the path on failure.
Status WriteTextFile(const std::string& path, const std::string& contents);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_REPORT_H_
