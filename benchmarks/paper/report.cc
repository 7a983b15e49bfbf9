#include "benchmarks/paper/report.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sk::bench {

std::string Cell::ToString() const {
  if (!is_number) return text;
  if (!std::isfinite(number)) return std::isnan(number) ? "nan" : (number > 0 ? "inf" : "-inf");
  char buf[64];
  if (precision >= 0) {
    std::snprintf(buf, sizeof(buf), "%.*f", precision, number);
  } else if (number == std::floor(number) && std::fabs(number) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", number);
  } else {
    std::snprintf(buf, sizeof(buf), "%.6g", number);
  }
  return buf;
}

Row& Row::Set(const std::string& column, const std::string& text) {
  Cell c;
  c.text = text;
  for (auto& [name, cell] : cells_) {
    if (name == column) {
      cell = c;
      return *this;
    }
  }
  cells_.emplace_back(column, c);
  return *this;
}

Row& Row::Set(const std::string& column, double number, int precision) {
  Cell c;
  c.is_number = true;
  c.number = number;
  c.precision = precision;
  for (auto& [name, cell] : cells_) {
    if (name == column) {
      cell = c;
      return *this;
    }
  }
  cells_.emplace_back(column, c);
  return *this;
}

Row& Row::Set(const std::string& column, int64_t number) {
  return Set(column, static_cast<double>(number), -1);
}

const Cell* Row::Find(const std::string& column) const {
  for (const auto& [name, cell] : cells_) {
    if (name == column) return &cell;
  }
  return nullptr;
}

double Row::Number(const std::string& column, double fallback) const {
  const Cell* c = Find(column);
  return c != nullptr && c->is_number ? c->number : fallback;
}

std::string Row::Text(const std::string& column) const {
  const Cell* c = Find(column);
  return c == nullptr ? "" : c->ToString();
}

std::vector<std::string> Table::Columns() const {
  std::vector<std::string> columns;
  for (const Row& row : rows_) {
    for (const auto& [name, cell] : row.cells()) {
      bool seen = false;
      for (const std::string& c : columns) seen = seen || c == name;
      if (!seen) columns.push_back(name);
    }
  }
  return columns;
}

namespace {

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

std::string Table::ToCsv() const {
  const std::vector<std::string> columns = Columns();
  std::ostringstream os;
  for (size_t i = 0; i < columns.size(); ++i) os << (i ? "," : "") << CsvField(columns[i]);
  os << "\n";
  for (const Row& row : rows_) {
    for (size_t i = 0; i < columns.size(); ++i) {
      const Cell* c = row.Find(columns[i]);
      os << (i ? "," : "") << (c == nullptr ? "" : CsvField(c->ToString()));
    }
    os << "\n";
  }
  return os.str();
}

std::string Table::ToJson() const {
  nlohmann::ordered_json doc;
  doc["table"] = name_;
  doc["columns"] = Columns();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  const std::vector<std::string> columns = Columns();
  for (const Row& row : rows_) {
    nlohmann::ordered_json r = nlohmann::ordered_json::object();
    for (const std::string& column : columns) {
      const Cell* c = row.Find(column);
      if (c == nullptr || (c->is_number && !std::isfinite(c->number))) {
        r[column] = nullptr;
      } else if (c->is_number) {
        r[column] = c->number;
      } else {
        r[column] = c->text;
      }
    }
    rows.push_back(std::move(r));
  }
  doc["rows"] = std::move(rows);
  return doc.dump(1) + "\n";
}

std::string Table::ToText(const std::vector<std::string>& wanted) const {
  const std::vector<std::string> columns = wanted.empty() ? Columns() : wanted;
  std::vector<size_t> width(columns.size());
  for (size_t i = 0; i < columns.size(); ++i) width[i] = columns[i].size();
  for (const Row& row : rows_) {
    for (size_t i = 0; i < columns.size(); ++i) width[i] = std::max(width[i], row.Text(columns[i]).size());
  }
  std::ostringstream os;
  auto line = [&](auto text_of) {
    std::string s;
    for (size_t i = 0; i < columns.size(); ++i) {
      std::string t = text_of(i);
      if (i) s += "  ";
      s += t + std::string(width[i] - t.size(), ' ');
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    os << s << "\n";
  };
  line([&](size_t i) { return columns[i]; });
  line([&](size_t i) { return std::string(width[i], '-'); });
  for (const Row& row : rows_) line([&](size_t i) { return row.Text(columns[i]); });
  return os.str();
}

std::string Table::ToMarkdown(const std::vector<std::string>& wanted) const {
  const std::vector<std::string> columns = wanted.empty() ? Columns() : wanted;
  auto escape = [](std::string s) {
    std::string out;
    for (char ch : s) {
      if (ch == '|') out += '\\';
      out += ch == '\n' ? ' ' : ch;
    }
    return out;
  };
  std::ostringstream os;
  os << "|";
  for (const std::string& c : columns) os << " " << escape(c) << " |";
  os << "\n|";
  for (size_t i = 0; i < columns.size(); ++i) os << "---|";
  os << "\n";
  for (const Row& row : rows_) {
    os << "|";
    for (const std::string& c : columns) os << " " << escape(row.Text(c)) << " |";
    os << "\n";
  }
  return os.str();
}

Status WriteTextFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return UnavailableError("cannot write " + path);
  return OkStatus();
}

Status Table::WriteFiles(const std::string& dir) const {
  SK_RETURN_IF_ERROR(WriteTextFile(dir + "/" + name_ + ".csv", ToCsv()));
  return WriteTextFile(dir + "/" + name_ + ".json", ToJson());
}

}  // namespace sk::bench
