// Copyright 2026 The ckptd Authors.
//
// Protocol-2 pickle writer (opcode emitters; see pickle.h).
#include <cstring>

#include "format/pickle/pickle.h"

namespace ckptd::pickle {
namespace {

void PutLE(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

void Writer::Proto(int version) {
  out_->push_back('\x80');
  out_->push_back(static_cast<char>(version));
}
void Writer::Stop() { out_->push_back('.'); }
void Writer::None() { out_->push_back('N'); }
void Writer::Bool(bool v) { out_->push_back(v ? '\x88' : '\x89'); }

void Writer::Int(int64_t v) {
  if (v >= 0 && v <= 0xff) {
    out_->push_back('K');
    PutLE(out_, static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    out_->push_back('M');
    PutLE(out_, static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_->push_back('J');
    PutLE(out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
  } else {
    // LONG1: minimal little-endian two's complement.
    uint64_t u = static_cast<uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const uint8_t top = (u >> (8 * (n - 1))) & 0xff;
      const uint8_t next_sign = (u >> (8 * (n - 2) + 7)) & 1;
      if ((top == 0x00 && next_sign == 0) || (top == 0xff && next_sign == 1)) {
        --n;
      } else {
        break;
      }
    }
    out_->push_back('\x8a');
    out_->push_back(static_cast<char>(n));
    PutLE(out_, u, n);
  }
}

void Writer::Float(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  out_->push_back('G');
  for (int i = 7; i >= 0; --i) out_->push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void Writer::String(std::string_view utf8) {
  out_->push_back('X');
  PutLE(out_, utf8.size(), 4);
  out_->append(utf8.data(), utf8.size());
}

void Writer::Bytes(std::string_view raw) {
  // Python's protocol-2 pickler writes bytes as
  //   _codecs.encode(<str of the latin-1 code points>, 'latin1')
  // so that Python 2 and 3 both read them back.
  Global("_codecs", "encode");
  std::string latin1;
  latin1.reserve(raw.size());
  for (unsigned char c : raw) {
    if (c < 0x80) {
      latin1.push_back(static_cast<char>(c));
    } else {
      latin1.push_back(static_cast<char>(0xc0 | (c >> 6)));
      latin1.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  String(latin1);
  String("latin1");
  Tuple2();
  Reduce();
}

void Writer::Global(std::string_view module, std::string_view name) {
  out_->push_back('c');
  out_->append(module.data(), module.size());
  out_->push_back('\n');
  out_->append(name.data(), name.size());
  out_->push_back('\n');
}

void Writer::Mark() { out_->push_back('('); }
void Writer::Tuple() { out_->push_back('t'); }
void Writer::EmptyTuple() { out_->push_back(')'); }
void Writer::Tuple1() { out_->push_back('\x85'); }
void Writer::Tuple2() { out_->push_back('\x86'); }
void Writer::Tuple3() { out_->push_back('\x87'); }
void Writer::EmptyList() { out_->push_back(']'); }
void Writer::Append() { out_->push_back('a'); }
void Writer::Appends() { out_->push_back('e'); }
void Writer::EmptyDict() { out_->push_back('}'); }
void Writer::SetItem() { out_->push_back('s'); }
void Writer::SetItems() { out_->push_back('u'); }
void Writer::Reduce() { out_->push_back('R'); }
void Writer::NewObj() { out_->push_back('\x81'); }
void Writer::Build() { out_->push_back('b'); }
void Writer::BinPersId() { out_->push_back('Q'); }

void Writer::Put(uint32_t index) {
  if (index <= 0xff) {
    out_->push_back('q');
    PutLE(out_, index, 1);
  } else {
    out_->push_back('r');
    PutLE(out_, index, 4);
  }
}

void Writer::Get(uint32_t index) {
  if (index <= 0xff) {
    out_->push_back('h');
    PutLE(out_, index, 1);
  } else {
    out_->push_back('j');
    PutLE(out_, index, 4);
  }
}

void Writer::IntTuple(absl::Span<const int64_t> values) {
  switch (values.size()) {
    case 0:
      EmptyTuple();
      return;
    case 1:
      Int(values[0]);
      Tuple1();
      return;
    case 2:
      Int(values[0]);
      Int(values[1]);
      Tuple2();
      return;
    case 3:
      Int(values[0]);
      Int(values[1]);
      Int(values[2]);
      Tuple3();
      return;
    default:
      Mark();
      for (int64_t v : values) Int(v);
      Tuple();
  }
}

void Writer::MemoGlobal(std::string_view module, std::string_view name) {
  std::string key;
  key.reserve(module.size() + name.size() + 2);
  key.push_back('\x01');
  key.append(module.data(), module.size());
  key.push_back('\n');
  key.append(name.data(), name.size());
  auto [it, inserted] = memo_.try_emplace(std::move(key), next_memo_);
  if (!inserted) {
    Get(it->second);
    return;
  }
  Global(module, name);
  Put(next_memo_++);
}

void Writer::MemoString(std::string_view utf8) {
  std::string key;
  key.reserve(utf8.size() + 1);
  key.push_back('\x02');
  key.append(utf8.data(), utf8.size());
  auto [it, inserted] = memo_.try_emplace(std::move(key), next_memo_);
  if (!inserted) {
    Get(it->second);
    return;
  }
  String(utf8);
  Put(next_memo_++);
}

}  // namespace ckptd::pickle
