// Copyright 2026 The ckptd Authors.
//
// pickle::Value's helpers and the typed accessors (see pickle.h).
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "format/pickle/pickle.h"

namespace ckptd::pickle {

bool Value::IsGlobal(std::string_view module_name,
                     std::string_view global_name) const {
  if (kind == Kind::kGlobal)
    return module == module_name && name == global_name;
  return IsCallTo(module_name, global_name);
}

bool Value::IsCallTo(std::string_view module_name,
                     std::string_view global_name) const {
  return kind == Kind::kObject && callable != nullptr &&
         callable->kind == Kind::kGlobal && callable->module == module_name &&
         callable->name == global_name;
}

const Value* Value::Get(std::string_view key) const {
  if (kind != Kind::kDict && kind != Kind::kObject) return nullptr;
  // Last match: Python keeps the last value of a duplicate key.
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    const Value* k = it->first;
    if (k != nullptr && k->kind == Kind::kString && k->str == key)
      return it->second;
  }
  return nullptr;
}

// clang-format off
std::string_view KindName(Value::Kind kind) {
  using K = Value::Kind;
  switch (kind) {
    case K::kNone: return "None";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kBigInt: return "bigint";
    case K::kFloat: return "float";
    case K::kString: return "str";
    case K::kBytes: return "bytes";
    case K::kTuple: return "tuple";
    case K::kList: return "list";
    case K::kDict: return "dict";
    case K::kSet: return "set";
    case K::kGlobal: return "global";
    case K::kObject: return "object";
    case K::kPersId: return "persid";
  }
  return "?";
}
// clang-format on

namespace {

std::string Describe(const Value& v) {
  std::string out(KindName(v.kind));
  if (v.kind != Value::Kind::kNone) {
    out += ' ';
    out += DebugString(v, 2, 80);
  }
  return out;
}

absl::Status TypeError(std::string_view expected, const Value& v) {
  return absl::InvalidArgumentError(
      fmt::format("expected {}, got {}", expected, Describe(v)));
}

}  // namespace

absl::StatusOr<int64_t> AsInt(const Value& v) {
  if (v.kind != Value::Kind::kInt) return TypeError("int", v);
  return v.i;
}

absl::StatusOr<std::string_view> AsString(const Value& v) {
  if (v.kind != Value::Kind::kString) return TypeError("str", v);
  return std::string_view(v.str);
}

absl::StatusOr<std::vector<int64_t>> AsIntVector(const Value& v) {
  if (v.kind != Value::Kind::kTuple && v.kind != Value::Kind::kList) {
    return TypeError("tuple or list of ints", v);
  }
  std::vector<int64_t> out;
  out.reserve(v.items.size());
  for (size_t k = 0; k < v.items.size(); ++k) {
    const Value* item = v.items[k];
    if (item == nullptr || item->kind != Value::Kind::kInt) {
      return absl::InvalidArgumentError(
          fmt::format("element {}: expected int, got {}", k,
                      item == nullptr ? std::string("null") : Describe(*item)));
    }
    out.push_back(item->i);
  }
  return out;
}

absl::StatusOr<std::string> AsBytes(const Value& v) {
  using K = Value::Kind;
  if (v.kind == K::kBytes) return v.str;
  if (v.kind == K::kObject && !v.newobj && v.args != nullptr &&
      v.args->kind == K::kTuple) {
    const auto& args = v.args->items;
    if ((v.IsCallTo("builtins", "bytes") ||
         v.IsCallTo("__builtin__", "bytes")) &&
        args.empty()) {
      return std::string();
    }
    if (v.IsCallTo("_codecs", "encode") && args.size() == 2 &&
        args[0] != nullptr && args[1] != nullptr &&
        args[0]->kind == K::kString && args[1]->kind == K::kString &&
        (args[1]->str == "latin1" || args[1]->str == "latin-1")) {
      // Code points U+0000..U+00FF, UTF-8 encoded, back to bytes.
      const std::string& s = args[0]->str;
      std::string out;
      out.reserve(s.size());
      for (size_t k = 0; k < s.size(); ++k) {
        const auto c = static_cast<uint8_t>(s[k]);
        if (c < 0x80) {
          out.push_back(static_cast<char>(c));
        } else if ((c == 0xc2 || c == 0xc3) && k + 1 < s.size() &&
                   (static_cast<uint8_t>(s[k + 1]) & 0xc0) == 0x80) {
          out.push_back(static_cast<char>(((c & 0x03) << 6) | (s[++k] & 0x3f)));
        } else {
          return absl::InvalidArgumentError(
              "_codecs.encode(..., 'latin1') of a code point above U+00FF");
        }
      }
      return out;
    }
  }
  return TypeError("bytes", v);
}

}  // namespace ckptd::pickle
