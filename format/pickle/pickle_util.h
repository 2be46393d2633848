// Copyright 2026 The ckptd Authors.
//
// The pickle machine's vocabulary (pickle_machine.h, and the .metadata
// decoder's pass 1 and fast paths, format/metadata/metadata_vm*.cc): opcode
// numbers and names, UTF-8 validation as Python's unpickler does it,
// integer operands, and the text encodings of protocol 0.
#ifndef CKPTD_FORMAT_PICKLE_PICKLE_UTIL_H_
#define CKPTD_FORMAT_PICKLE_PICKLE_UTIL_H_

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ckptd::pickle::internal {

// Opcodes (CPython Lib/pickle.py).
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};

constexpr int kHighestProtocol = 5;
// Python refuses int() of longer decimal strings (sys.int_info), and the
// decimal→binary conversion is quadratic, so cap it.
constexpr size_t kMaxIntDigits = 4300;

// "REDUCE", "BINGET", ... ("unknown" for other bytes).
const char* OpName(uint8_t op);

// What follows an opcode's byte, for a scanner that skips operands without
// running the program (the .metadata decoder's pass 1). The pickle machine
// (pickle_machine.h) reads the same operands: pickle_machine_test checks
// every opcode.
enum class OperandKind : uint8_t {
  kNone,
  kFixed,     // `size` bytes
  kCounted,   // a `size`-byte length, then that many bytes
  kLine,      // up to '\n'
  kTwoLines,  // GLOBAL, INST
  kGet,       // a `size`-byte memo index: BINGET, LONG_BINGET
  kGetLine,   // GET: a decimal memo index, a line
  kEnd,       // STOP, the opcodes the machine refuses, unknown bytes
};
struct OperandLayout {
  OperandKind kind = OperandKind::kEnd;
  uint8_t size = 0;
};
// The operand of every byte as an opcode.
std::array<OperandLayout, 256> OperandLayouts();

// n-byte little-endian unsigned (n = 1, 2, 4, 8 are the operand widths).
inline uint64_t LoadLE(const char* p, int n) {
  switch (n) {
    case 1:
      return static_cast<uint8_t>(p[0]);
    case 2:
      return uint64_t{static_cast<uint8_t>(p[0])} |
             uint64_t{static_cast<uint8_t>(p[1])} << 8;
    case 4: {
      static_assert(std::endian::native == std::endian::little);
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default:
      break;
  }
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// UTF-8 as Python's "surrogatepass" decoder accepts it: well-formed UTF-8
// plus encoded surrogates (ED A0..BF xx).
bool IsValidUtf8(const char* s, size_t n);
void AppendUtf8(uint32_t cp, std::string* out);
std::string_view TrimSpace(std::string_view s);

// The integer in n little-endian two's-complement bytes: true and *small if
// it fits in int64, else false and *big = its minimal bytes.
bool IntFromBytes(const uint8_t* b, size_t n, int64_t* small, std::string* big);
// A decimal integer (optional sign, surrounding whitespace, at most
// kMaxIntDigits digits) as little-endian two's-complement bytes (not
// minimal); false if malformed.
bool DecimalToBytes(std::string_view s, std::string* bytes);
bool ParseDecimalU64(std::string_view s, uint64_t* out);
// Python's codecs.escape_decode (protocol-0 STRING operands).
bool EscapeDecode(std::string_view s, std::string* out);
// Python's raw_unicode_escape decoding (protocol-0 UNICODE operands) into
// UTF-8 (surrogatepass).
bool RawUnicodeEscapeDecode(std::string_view s, std::string* out);

}  // namespace ckptd::pickle::internal

#endif  // CKPTD_FORMAT_PICKLE_PICKLE_UTIL_H_
