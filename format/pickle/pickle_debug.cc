// Copyright 2026 The ckptd Authors.
//
// DebugString (pickle.h): a bounded rendering of a Value graph.
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "format/pickle/pickle.h"

namespace ckptd::pickle {
namespace {

bool IsContainer(Value::Kind k) {
  using K = Value::Kind;
  return k == K::kTuple || k == K::kList || k == K::kDict || k == K::kSet ||
         k == K::kObject || k == K::kPersId;
}

// Bounded renderer behind DebugString.
class DebugPrinter {
 public:
  DebugPrinter(int max_depth, size_t max_len)
      : max_depth_(max_depth), max_len_(max_len) {}

  std::string Finish() {
    if (truncated_) out_ += "...";
    return std::move(out_);
  }

  void Print(const Value* v, int depth);

 private:
  using Kind = Value::Kind;
  bool full() const { return truncated_; }
  void Put(std::string_view s) {
    if (truncated_) return;
    if (out_.size() + s.size() > max_len_) {
      size_t n = max_len_ - out_.size();
      // Do not cut a UTF-8 sequence.
      while (n > 0 && n < s.size() &&
             (static_cast<uint8_t>(s[n]) & 0xc0) == 0x80)
        --n;
      out_.append(s.data(), n);
      truncated_ = true;
      return;
    }
    out_.append(s.data(), s.size());
  }
  void PutQuoted(const std::string& s, bool bytes);
  void PutItems(const std::vector<const Value*>& items, int depth) {
    for (size_t k = 0; k < items.size() && !full(); ++k) {
      if (k > 0) Put(", ");
      Print(items[k], depth + 1);
    }
  }
  // open, the items, close.
  void PutItemsIn(std::string_view open, const std::vector<const Value*>& items,
                  int depth, std::string_view close) {
    Put(open);
    PutItems(items, depth);
    Put(close);
  }
  // {k: v, ...}
  void PutEntries(
      const std::vector<std::pair<const Value*, const Value*>>& entries,
      int depth) {
    Put("{");
    for (size_t k = 0; k < entries.size() && !full(); ++k) {
      if (k > 0) Put(", ");
      Print(entries[k].first, depth + 1);
      Put(": ");
      Print(entries[k].second, depth + 1);
    }
    Put("}");
  }
  void PutBigInt(const std::string& le);
  // None, bools, numbers, strings, bytes and globals.
  void PutScalar(const Value& v);
  // Tuples, lists, sets, dicts and persistent ids (not yet on path_).
  void PutContainer(const Value& v, int depth);
  // A kObject: its call, then what was added to it.
  void PutObject(const Value& v, int depth);

  const int max_depth_;
  const size_t max_len_;
  std::string out_;
  bool truncated_ = false;
  std::vector<const Value*> path_;  // containers being printed (cycle check)
};

void DebugPrinter::PutQuoted(const std::string& s, bool bytes) {
  constexpr size_t kMaxShown = 200;
  std::string q = bytes ? "b'" : "'";
  size_t n = std::min(s.size(), kMaxShown);
  if (!bytes) {  // do not cut a UTF-8 sequence
    while (n > 0 && n < s.size() && (static_cast<uint8_t>(s[n]) & 0xc0) == 0x80)
      --n;
  }
  for (size_t k = 0; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[k]);
    if (c == '\\' || c == '\'') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c == '\n') {
      q += "\\n";
    } else if (c == '\r') {
      q += "\\r";
    } else if (c == '\t') {
      q += "\\t";
    } else if (c < 0x20 || c == 0x7f || (bytes && c >= 0x80)) {
      q += fmt::format("\\x{:02x}", c);
    } else {
      q += static_cast<char>(c);
    }
  }
  if (n < s.size()) q += fmt::format("...({} bytes)", s.size());
  q += '\'';
  Put(q);
}

void DebugPrinter::PutBigInt(const std::string& le) {
  if (le.empty() || le.size() > 64) {
    Put(fmt::format("<int of {} bytes>", le.size()));
    return;
  }
  // Magnitude, then repeated division by 10.
  std::vector<uint8_t> mag(le.begin(), le.end());
  const bool negative = mag.back() & 0x80;
  if (negative) {
    unsigned carry = 1;
    for (uint8_t& b : mag) {
      const unsigned t = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(t);
      carry = t >> 8;
    }
  }
  std::string digits;
  while (true) {
    bool zero = true;
    unsigned rem = 0;
    for (size_t k = mag.size(); k-- > 0;) {
      const unsigned cur = (rem << 8) | mag[k];
      mag[k] = static_cast<uint8_t>(cur / 10);
      rem = cur % 10;
      if (mag[k] != 0) zero = false;
    }
    digits.push_back(static_cast<char>('0' + rem));
    if (zero) break;
  }
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  Put(digits);
}

void DebugPrinter::Print(const Value* v, int depth) {
  if (full()) return;
  if (v == nullptr) {
    Put("<null>");
    return;
  }
  if (!IsContainer(v->kind)) {
    PutScalar(*v);
    return;
  }
  if (depth >= max_depth_ ||
      std::find(path_.begin(), path_.end(), v) != path_.end()) {
    Put("...");
    return;
  }
  path_.push_back(v);
  if (v->kind == Kind::kObject) {
    PutObject(*v, depth);
  } else {
    PutContainer(*v, depth);
  }
  path_.pop_back();
}

void DebugPrinter::PutScalar(const Value& v) {
  switch (v.kind) {
    case Kind::kNone:
      Put("None");
      return;
    case Kind::kBool:
      Put(v.b ? "True" : "False");
      return;
    case Kind::kInt:
      Put(fmt::format("{}", v.i));
      return;
    case Kind::kBigInt:
      PutBigInt(v.str);
      return;
    case Kind::kFloat:
      Put(fmt::format("{}", v.f));
      return;
    case Kind::kString:
    case Kind::kBytes:
      PutQuoted(v.str, v.kind == Kind::kBytes);
      return;
    case Kind::kGlobal:
      Put(v.module);
      Put(".");
      Put(v.name);
      return;
    default:
      return;
  }
}

void DebugPrinter::PutContainer(const Value& v, int depth) {
  switch (v.kind) {
    case Kind::kTuple:
      PutItemsIn("(", v.items, depth, v.items.size() == 1 ? ",)" : ")");
      return;
    case Kind::kList:
      PutItemsIn("[", v.items, depth, "]");
      return;
    case Kind::kSet:
      if (v.items.empty()) {
        Put("set()");
      } else {
        PutItemsIn("{", v.items, depth, "}");
      }
      return;
    case Kind::kDict:
      PutEntries(v.entries, depth);
      return;
    case Kind::kPersId:
      Put("persid(");
      Print(v.pid, depth + 1);
      Put(")");
      return;
    default:
      return;
  }
}

// callable(args) / callable.__new__(args, **kwargs), then what
// APPENDS/SETITEMS/BUILD added.
void DebugPrinter::PutObject(const Value& v, int depth) {
  Print(v.callable, depth + 1);
  Put(v.newobj ? ".__new__(" : "(");
  if (v.args != nullptr && v.args->kind == Kind::kTuple) {
    PutItems(v.args->items, depth + 1);
  } else {
    Print(v.args, depth + 1);
  }
  if (v.kwargs != nullptr) {
    Put(", **");
    Print(v.kwargs, depth + 1);
  }
  Put(")");
  if (!v.items.empty()) PutItemsIn("[", v.items, depth, "]");
  if (!v.entries.empty()) PutEntries(v.entries, depth);
  if (v.state != nullptr) {
    Put(" state=");
    Print(v.state, depth + 1);
  }
}

}  // namespace

std::string DebugString(const Value& v, int max_depth, size_t max_len) {
  // Print() recurses once per level: keep the native stack safe.
  constexpr int kMaxDepth = 200;
  DebugPrinter printer(std::min(max_depth, kMaxDepth), max_len);
  printer.Print(&v, 0);
  return printer.Finish();
}

}  // namespace ckptd::pickle
