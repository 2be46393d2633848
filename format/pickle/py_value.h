// Copyright 2026 The ckptd Authors.
//
// PyValue: plain Python values (None, bool, int, float, str, bytes, list,
// tuple, dict) — what DCP stores as BYTE_IO items for optimizer
// hyper-parameters, step counters, RNG seeds and the like. Converts to and
// from pickles, and to/from complete torch.save archives (the BYTE_IO payload
// format, dcp-format.md §2).
#ifndef CKPTD_FORMAT_PICKLE_PY_VALUE_H_
#define CKPTD_FORMAT_PICKLE_PY_VALUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "format/pickle/pickle.h"

namespace ckptd::format {

struct PyValue {
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                      // kStr (UTF-8), kBytes
  // kList, kTuple: the items. kDict: the keys, in insertion order, with
  // their values at the same positions in `values`. (Two vectors rather
  // than a vector of pairs: pair<PyValue, PyValue> needs a complete type.)
  std::vector<PyValue> items;
  std::vector<PyValue> values;

  static PyValue None();
  static PyValue Bool(bool v);
  static PyValue Int(int64_t v);
  static PyValue Float(double v);
  static PyValue Str(std::string v);
  static PyValue Bytes(std::string v);
  static PyValue List(std::vector<PyValue> v);
  static PyValue Tuple(std::vector<PyValue> v);
  static PyValue Dict(std::vector<std::pair<PyValue, PyValue>> v);

  bool operator==(const PyValue& o) const;
  // Python repr()-like rendering ("{'lr': 0.1, 'betas': (0.9, 0.999)}").
  std::string Repr() const;
};

// Appends the pickle opcodes that construct `v` (no PROTO/STOP).
void WritePyValue(const PyValue& v, pickle::Writer* w);

// Converts a parsed pickle value holding only plain values (OrderedDict is
// accepted as a dict, _codecs.encode(…, 'latin1') as bytes, bytearray as
// bytes). Anything else → UNIMPLEMENTED naming the type ("torch.nn.Module
// object: only plain Python values can be decoded outside Python").
absl::StatusOr<PyValue> PyValueFromPickle(const pickle::Value& v,
                                          int max_depth = 200);

// A complete torch.save archive of `v` (the BYTE_IO payload DCP writes):
// records data.pkl (protocol 2), byteorder, version.
std::string EncodeTorchSaveObject(const PyValue& v);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_PICKLE_PY_VALUE_H_
