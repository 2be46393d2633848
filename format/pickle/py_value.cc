// Copyright 2026 The ckptd Authors.
#include "format/pickle/py_value.h"

#include <cmath>

#include "fmt/format.h"
#include "format/tensor/tensor_record_writer.h"
#include "format/zip/zip.h"

namespace ckptd::format {

PyValue PyValue::None() { return {}; }
PyValue PyValue::Bool(bool v) {
  PyValue p;
  p.kind = Kind::kBool;
  p.b = v;
  return p;
}
PyValue PyValue::Int(int64_t v) {
  PyValue p;
  p.kind = Kind::kInt;
  p.i = v;
  return p;
}
PyValue PyValue::Float(double v) {
  PyValue p;
  p.kind = Kind::kFloat;
  p.f = v;
  return p;
}
PyValue PyValue::Str(std::string v) {
  PyValue p;
  p.kind = Kind::kStr;
  p.s = std::move(v);
  return p;
}
PyValue PyValue::Bytes(std::string v) {
  PyValue p;
  p.kind = Kind::kBytes;
  p.s = std::move(v);
  return p;
}
PyValue PyValue::List(std::vector<PyValue> v) {
  PyValue p;
  p.kind = Kind::kList;
  p.items = std::move(v);
  return p;
}
PyValue PyValue::Tuple(std::vector<PyValue> v) {
  PyValue p;
  p.kind = Kind::kTuple;
  p.items = std::move(v);
  return p;
}
PyValue PyValue::Dict(std::vector<std::pair<PyValue, PyValue>> v) {
  PyValue p;
  p.kind = Kind::kDict;
  p.items.reserve(v.size());
  p.values.reserve(v.size());
  for (auto& [k, val] : v) {
    p.items.push_back(std::move(k));
    p.values.push_back(std::move(val));
  }
  return p;
}

bool PyValue::operator==(const PyValue& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b == o.b;
    case Kind::kInt:
      return i == o.i;
    case Kind::kFloat:
      return f == o.f || (std::isnan(f) && std::isnan(o.f));
    case Kind::kStr:
    case Kind::kBytes:
      return s == o.s;
    case Kind::kList:
    case Kind::kTuple:
      return items == o.items;
    case Kind::kDict:
      return items == o.items && values == o.values;
  }
  return false;
}

namespace {

std::string QuoteStr(const std::string& s, char prefix) {
  std::string out;
  if (prefix) out.push_back(prefix);
  out.push_back('\'');
  for (unsigned char c : s) {
    if (c == '\'' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || (prefix == 'b' && c >= 0x7f)) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('\'');
  return out;
}

}  // namespace

std::string PyValue::Repr() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i);
    case Kind::kFloat: {
      if (std::isnan(f)) return "nan";
      if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
      std::string r = fmt::format("{}", f);
      if (r.find_first_of(".en") == std::string::npos) r += ".0";
      return r;
    }
    case Kind::kStr:
      return QuoteStr(s, 0);
    case Kind::kBytes:
      return QuoteStr(s, 'b');
    case Kind::kList:
    case Kind::kTuple: {
      std::string r = kind == Kind::kList ? "[" : "(";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) r += ", ";
        r += items[k].Repr();
      }
      if (kind == Kind::kTuple && items.size() == 1) r += ",";
      r += kind == Kind::kList ? "]" : ")";
      return r;
    }
    case Kind::kDict: {
      std::string r = "{";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) r += ", ";
        r += items[k].Repr() + ": " + values[k].Repr();
      }
      return r + "}";
    }
  }
  return "?";
}

void WritePyValue(const PyValue& v, pickle::Writer* w) {
  using K = PyValue::Kind;
  switch (v.kind) {
    case K::kNone:
      w->None();
      return;
    case K::kBool:
      w->Bool(v.b);
      return;
    case K::kInt:
      w->Int(v.i);
      return;
    case K::kFloat:
      w->Float(v.f);
      return;
    case K::kStr:
      w->String(v.s);
      return;
    case K::kBytes:
      w->Bytes(v.s);
      return;
    case K::kList:
      w->EmptyList();
      if (!v.items.empty()) {
        w->Mark();
        for (const auto& it : v.items) WritePyValue(it, w);
        w->Appends();
      }
      return;
    case K::kTuple:
      w->Mark();
      for (const auto& it : v.items) WritePyValue(it, w);
      w->Tuple();
      return;
    case K::kDict:
      w->EmptyDict();
      if (!v.items.empty()) {
        w->Mark();
        for (size_t k = 0; k < v.items.size(); ++k) {
          WritePyValue(v.items[k], w);
          WritePyValue(v.values[k], w);
        }
        w->SetItems();
      }
      return;
  }
}

namespace {

using PK = pickle::Value::Kind;

// A tuple, list or set (as a list) of plain values.
absl::StatusOr<PyValue> FromSequence(const pickle::Value& v, int max_depth) {
  std::vector<PyValue> items;
  items.reserve(v.items.size());
  for (const pickle::Value* it : v.items) {
    auto r = PyValueFromPickle(*it, max_depth - 1);
    if (!r.ok()) return r.status();
    items.push_back(*std::move(r));
  }
  return v.kind == PK::kTuple ? PyValue::Tuple(std::move(items))
                              : PyValue::List(std::move(items));
}

// A dict (or an OrderedDict's items) of plain keys and values.
absl::StatusOr<PyValue> FromEntries(
    const std::vector<std::pair<const pickle::Value*, const pickle::Value*>>&
        pickled,
    int max_depth) {
  std::vector<std::pair<PyValue, PyValue>> entries;
  entries.reserve(pickled.size());
  for (const auto& [k, val] : pickled) {
    auto kr = PyValueFromPickle(*k, max_depth - 1);
    if (!kr.ok()) return kr.status();
    auto vr = PyValueFromPickle(*val, max_depth - 1);
    if (!vr.ok()) return vr.status();
    entries.emplace_back(*std::move(kr), *std::move(vr));
  }
  return PyValue::Dict(std::move(entries));
}

// The objects that stand for plain values: OrderedDict, the protocol-2
// spellings of bytes (_codecs.encode of latin-1 text, bytearray(bytes)).
absl::StatusOr<PyValue> FromObject(const pickle::Value& v, int max_depth) {
  if (v.IsCallTo("collections", "OrderedDict")) {
    return FromEntries(v.entries, max_depth);
  }
  if (v.IsCallTo("_codecs", "encode") && v.args != nullptr &&
      v.args->kind == PK::kTuple && !v.args->items.empty() &&
      v.args->items[0]->kind == PK::kString) {
    // latin-1 code points (UTF-8 encoded in the pickle) back to bytes.
    const std::string& u = v.args->items[0]->str;
    std::string raw;
    for (size_t k = 0; k < u.size(); ++k) {
      unsigned char c = u[k];
      if (c < 0x80) {
        raw.push_back(static_cast<char>(c));
      } else if ((c & 0xe0) == 0xc0 && k + 1 < u.size()) {
        raw.push_back(static_cast<char>(((c & 0x1f) << 6) | (u[k + 1] & 0x3f)));
        ++k;
      } else {
        return absl::InvalidArgumentError("bytes value is not latin-1");
      }
    }
    return PyValue::Bytes(std::move(raw));
  }
  if (v.IsCallTo("builtins", "bytearray") && v.args != nullptr &&
      v.args->kind == PK::kTuple && v.args->items.size() == 1 &&
      v.args->items[0]->kind == PK::kBytes) {
    return PyValue::Bytes(v.args->items[0]->str);
  }
  std::string what = "object";
  if (v.callable != nullptr && v.callable->kind == PK::kGlobal) {
    what = v.callable->module + "." + v.callable->name + " object";
  }
  return absl::UnimplementedError(fmt::format(
      "{}: only plain Python values can be decoded outside Python", what));
}

}  // namespace

absl::StatusOr<PyValue> PyValueFromPickle(const pickle::Value& v,
                                          int max_depth) {
  if (max_depth <= 0) {
    return absl::InvalidArgumentError("value nested too deeply (or cyclic)");
  }
  switch (v.kind) {
    case PK::kNone:
      return PyValue::None();
    case PK::kBool:
      return PyValue::Bool(v.b);
    case PK::kInt:
      return PyValue::Int(v.i);
    case PK::kFloat:
      return PyValue::Float(v.f);
    case PK::kString:
      return PyValue::Str(v.str);
    case PK::kBytes:
      return PyValue::Bytes(v.str);
    case PK::kBigInt:
      return absl::UnimplementedError(fmt::format(
          "integer of {} bytes does not fit in 64 bits", v.str.size()));
    case PK::kTuple:
    case PK::kList:
    case PK::kSet:
      return FromSequence(v, max_depth);
    case PK::kDict:
      return FromEntries(v.entries, max_depth);
    case PK::kObject:
      return FromObject(v, max_depth);
    case PK::kGlobal:
      return absl::UnimplementedError(
          fmt::format("reference to {}.{}: only plain Python values can be "
                      "decoded outside Python",
                      v.module, v.name));
    case PK::kPersId:
      return absl::UnimplementedError(
          "value holds tensor storage: only plain Python values can be decoded "
          "outside Python");
  }
  return absl::InternalError("unreachable");
}

std::string EncodeTorchSaveObject(const PyValue& v) {
  std::string pkl;
  pickle::Writer w(&pkl);
  w.Proto(2);
  WritePyValue(v, &w);
  w.Stop();
  ZipArchiveBuilder builder;
  BeginTorchSaveRecords(&builder, std::move(pkl));
  FinishTorchSaveRecords(&builder);
  std::string out(builder.size(), '\0');
  builder.FinishInto(out.data());
  return out;
}

}  // namespace ckptd::format
