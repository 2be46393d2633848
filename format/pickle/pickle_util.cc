// Copyright 2026 The ckptd Authors.
#include "format/pickle/pickle_util.h"

#include <array>
#include <charconv>
#include <cstring>
#include <vector>

namespace ckptd::pickle::internal {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Little-endian two's complement bytes, shortened to the minimal length
// (at least one byte) that keeps the value.
size_t MinimalLength(const uint8_t* b, size_t n) {
  if (n == 0) return 0;
  const uint8_t fill = (b[n - 1] & 0x80) ? 0xff : 0x00;
  while (n > 1 && b[n - 1] == fill && (b[n - 2] & 0x80) == (fill & 0x80)) --n;
  return n;
}

}  // namespace

// clang-format off
const char* OpName(uint8_t op) {
  switch (op) {
    case kMark: return "MARK";
    case kStop: return "STOP";
    case kPop: return "POP";
    case kPopMark: return "POP_MARK";
    case kDup: return "DUP";
    case kFloat: return "FLOAT";
    case kInt: return "INT";
    case kBinInt: return "BININT";
    case kBinInt1: return "BININT1";
    case kLong: return "LONG";
    case kBinInt2: return "BININT2";
    case kNone: return "NONE";
    case kPersId: return "PERSID";
    case kBinPersId: return "BINPERSID";
    case kReduce: return "REDUCE";
    case kString: return "STRING";
    case kBinString: return "BINSTRING";
    case kShortBinString: return "SHORT_BINSTRING";
    case kUnicode: return "UNICODE";
    case kBinUnicode: return "BINUNICODE";
    case kAppend: return "APPEND";
    case kBuild: return "BUILD";
    case kGlobal: return "GLOBAL";
    case kDict: return "DICT";
    case kEmptyDict: return "EMPTY_DICT";
    case kAppends: return "APPENDS";
    case kGet: return "GET";
    case kBinGet: return "BINGET";
    case kInst: return "INST";
    case kLongBinGet: return "LONG_BINGET";
    case kList: return "LIST";
    case kEmptyList: return "EMPTY_LIST";
    case kObj: return "OBJ";
    case kPut: return "PUT";
    case kBinPut: return "BINPUT";
    case kLongBinPut: return "LONG_BINPUT";
    case kSetItem: return "SETITEM";
    case kTuple: return "TUPLE";
    case kEmptyTuple: return "EMPTY_TUPLE";
    case kSetItems: return "SETITEMS";
    case kBinFloat: return "BINFLOAT";
    case kProto: return "PROTO";
    case kNewObj: return "NEWOBJ";
    case kExt1: return "EXT1";
    case kExt2: return "EXT2";
    case kExt4: return "EXT4";
    case kTuple1: return "TUPLE1";
    case kTuple2: return "TUPLE2";
    case kTuple3: return "TUPLE3";
    case kNewTrue: return "NEWTRUE";
    case kNewFalse: return "NEWFALSE";
    case kLong1: return "LONG1";
    case kLong4: return "LONG4";
    case kBinBytes: return "BINBYTES";
    case kShortBinBytes: return "SHORT_BINBYTES";
    case kShortBinUnicode: return "SHORT_BINUNICODE";
    case kBinUnicode8: return "BINUNICODE8";
    case kBinBytes8: return "BINBYTES8";
    case kEmptySet: return "EMPTY_SET";
    case kAddItems: return "ADDITEMS";
    case kFrozenSet: return "FROZENSET";
    case kNewObjEx: return "NEWOBJ_EX";
    case kStackGlobal: return "STACK_GLOBAL";
    case kMemoize: return "MEMOIZE";
    case kFrame: return "FRAME";
    case kByteArray8: return "BYTEARRAY8";
    case kNextBuffer: return "NEXT_BUFFER";
    case kReadOnlyBuffer: return "READONLY_BUFFER";
  }
  return "unknown";
}
// clang-format on

std::array<OperandLayout, 256> OperandLayouts() {
  using K = OperandKind;
  std::array<OperandLayout, 256> t{};
  for (int op = 0; op < 256; ++op) {
    if (std::string_view(OpName(static_cast<uint8_t>(op))) != "unknown") {
      t[op] = {K::kNone, 0};
    }
  }
  for (uint8_t op : {kBinInt1, kBinPut, kProto}) t[op] = {K::kFixed, 1};
  t[kBinInt2] = {K::kFixed, 2};
  for (uint8_t op : {kBinInt, kLongBinPut}) t[op] = {K::kFixed, 4};
  for (uint8_t op : {kBinFloat, kFrame}) t[op] = {K::kFixed, 8};
  for (uint8_t op :
       {kLong1, kShortBinUnicode, kShortBinBytes, kShortBinString}) {
    t[op] = {K::kCounted, 1};
  }
  for (uint8_t op : {kLong4, kBinUnicode, kBinBytes, kBinString}) {
    t[op] = {K::kCounted, 4};
  }
  for (uint8_t op : {kBinUnicode8, kBinBytes8, kByteArray8}) {
    t[op] = {K::kCounted, 8};
  }
  for (uint8_t op : {kInt, kLong, kFloat, kString, kUnicode, kPut, kPersId}) {
    t[op] = {K::kLine, 0};
  }
  t[kGlobal] = t[kInst] = {K::kTwoLines, 0};
  t[kBinGet] = {K::kGet, 1};
  t[kLongBinGet] = {K::kGet, 4};
  t[kGet] = {K::kGetLine, 0};
  for (uint8_t op :
       {kStop, kExt1, kExt2, kExt4, kNextBuffer, kReadOnlyBuffer}) {
    t[op] = {K::kEnd, 0};
  }
  return t;
}

// UTF-8 as Python's "surrogatepass" decoder accepts it: well-formed UTF-8
// plus encoded surrogates (ED A0..BF xx).
bool IsValidUtf8(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const uint8_t*>(s);
  const uint8_t* end = p + n;
  while (p < end) {
    // ASCII fast path, 8 bytes at a time.
    while (end - p >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      if (w & 0x8080808080808080ull) break;
      p += 8;
    }
    if (p == end) break;
    const uint8_t c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int len;
    uint8_t lo = 0x80, hi = 0xbf;  // bounds of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (end - p < len) return false;
    if (p[1] < lo || p[1] > hi) return false;
    for (int i = 2; i < len; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
    }
    p += len;
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string_view TrimSpace(std::string_view s) {
  auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' ||
           c == '\v';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

bool ParseDecimalU64(std::string_view s, uint64_t* out) {
  s = TrimSpace(s);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Python's codecs.escape_decode (protocol-0 STRING operands).
bool EscapeDecode(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (++i == s.size()) return false;  // trailing backslash
    const char e = s[i];
    switch (e) {
      case '\n':
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '\'':
        out->push_back('\'');
        break;
      case '"':
        out->push_back('"');
        break;
      case 'a':
        out->push_back('\a');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'v':
        out->push_back('\v');
        break;
      case 'x': {
        if (i + 2 >= s.size()) return false;
        const int h = HexDigit(s[i + 1]), l = HexDigit(s[i + 2]);
        if (h < 0 || l < 0) return false;
        out->push_back(static_cast<char>(h * 16 + l));
        i += 2;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0;
               k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7';
               ++k) {
            v = v * 8 + (s[++i] - '0');
          }
          out->push_back(static_cast<char>(v & 0xff));
        } else {
          out->push_back('\\');
          out->push_back(e);
        }
    }
  }
  return true;
}

// Python's raw_unicode_escape decoding (protocol-0 UNICODE operands) into
// UTF-8 (surrogatepass).
bool RawUnicodeEscapeDecode(std::string_view s, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c != '\\') {
      AppendUtf8(c, out);
      ++i;
      continue;
    }
    // A \u or \U escape only when the run of backslashes is odd.
    size_t run = 0;
    while (i < s.size() && s[i] == '\\') ++run, ++i;
    const bool escape =
        (run & 1) && i < s.size() && (s[i] == 'u' || s[i] == 'U');
    out->append(escape ? run - 1 : run, '\\');
    if (!escape) continue;
    const int digits = s[i] == 'u' ? 4 : 8;
    ++i;
    if (s.size() - i < static_cast<size_t>(digits)) return false;
    uint32_t cp = 0;
    for (int k = 0; k < digits; ++k) {
      const int d = HexDigit(s[i + k]);
      if (d < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    if (cp > 0x10ffff) return false;
    i += digits;
    AppendUtf8(cp, out);
  }
  return true;
}

bool IntFromBytes(const uint8_t* b, size_t n, int64_t* small,
                  std::string* big) {
  n = MinimalLength(b, n);
  if (n <= 8) {
    uint64_t u = 0;
    for (size_t i = 0; i < n; ++i) u |= uint64_t{b[i]} << (8 * i);
    if (n > 0 && n < 8 && (b[n - 1] & 0x80)) u |= ~uint64_t{0} << (8 * n);
    *small = static_cast<int64_t>(u);
    return true;
  }
  big->assign(reinterpret_cast<const char*>(b), n);
  return false;
}

bool DecimalToBytes(std::string_view s, std::string* bytes) {
  s = TrimSpace(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.size() > kMaxIntDigits) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  while (s.size() > 1 && s[0] == '0') s.remove_prefix(1);
  // Magnitude as little-endian 32-bit limbs.
  std::vector<uint32_t> limbs;
  for (char c : s) {
    uint64_t carry = static_cast<uint64_t>(c - '0');
    for (uint32_t& limb : limbs) {
      const uint64_t t = uint64_t{limb} * 10 + carry;
      limb = static_cast<uint32_t>(t);
      carry = t >> 32;
    }
    if (carry != 0) limbs.push_back(static_cast<uint32_t>(carry));
  }
  // Two's complement with one spare byte for the sign.
  bytes->assign(limbs.size() * 4 + 1, '\0');
  for (size_t i = 0; i < limbs.size(); ++i) {
    for (int k = 0; k < 4; ++k)
      (*bytes)[4 * i + k] = static_cast<char>(limbs[i] >> (8 * k));
  }
  if (negative) {
    unsigned carry = 1;
    for (char& c : *bytes) {
      const unsigned t = static_cast<uint8_t>(~static_cast<uint8_t>(c)) + carry;
      c = static_cast<char>(t & 0xff);
      carry = t >> 8;
    }
  }
  return true;
}

}  // namespace ckptd::pickle::internal
