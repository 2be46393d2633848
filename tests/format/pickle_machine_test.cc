// Copyright 2026 The ckptd Authors.
//
// The pickle machine (format/pickle/pickle_machine.h) behind both pickle
// VMs: pickle::Parse and the streaming .metadata decoder
// (DecodeCompactMetadata) read every opcode's operand as OperandLayouts()
// (pickle_util.h, the decoder's pass 1) says, and report the same error,
// word for word, for the same malformed program.
#include <bit>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "format/metadata/metadata_decode.h"
#include "format/pickle/pickle.h"
#include "format/pickle/pickle_util.h"
#include "gtest/gtest.h"

namespace ckptd::pickle {
namespace {

using internal::OperandKind;

std::string B(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

// v's n low bytes, little-endian (the host's order).
std::string LE(uint64_t v, int n) {
  static_assert(std::endian::native == std::endian::little);
  return std::string(reinterpret_cast<const char*>(&v), n);
}

// The error of each VM on `data` ("ok" if it parses).
std::string ParseError(std::string_view data) {
  ReaderOptions options;
  options.source_name = "m";
  auto doc = Parse(data, options);
  return doc.ok() ? "ok" : std::string(doc.status().message());
}

std::string DecodeError(std::string_view data) {
  format::DecodeOptions options;
  options.source_name = "m";
  auto md = format::DecodeCompactMetadata(data, options);
  return md.ok() ? "ok" : std::string(md.status().message());
}

TEST(PickleMachineTest, OperandsAreReadAsTheLayoutsSay) {
  const auto layouts = internal::OperandLayouts();
  for (int op = 0; op < 256; ++op) {
    const internal::OperandLayout layout = layouts[op];
    // The opcode alone: the machine runs out of input reading its operand.
    std::string data = B({op});
    std::string want;
    switch (layout.kind) {
      case OperandKind::kFixed:
      case OperandKind::kCounted:
      case OperandKind::kGet:
        want = "truncated: needs " + std::to_string(layout.size) +
               " bytes at offset 1, 0 left";
        break;
      case OperandKind::kLine:
      case OperandKind::kGetLine:
        want = "truncated: missing end of line";
        break;
      case OperandKind::kTwoLines:  // the first line read, not the second
        data += "m\n";
        want = "truncated: missing end of line";
        break;
      case OperandKind::kNone:
        want = "";
        break;
      case OperandKind::kEnd:
        want = op == internal::kStop ? "stack underflow"
               : std::string_view(internal::OpName(op)) == "unknown"
                   ? "unknown opcode"
                   : "unsupported opcode";
        break;
    }
    const std::string parsed = ParseError(data);
    SCOPED_TRACE(parsed);
    EXPECT_EQ(parsed, DecodeError(data)) << "opcode " << op;
    if (layout.kind == OperandKind::kNone) {
      EXPECT_EQ(parsed.find("truncated"), std::string::npos) << op;
    } else {
      EXPECT_NE(parsed.find(want), std::string::npos) << op;
    }
  }
}

TEST(PickleMachineTest, BothVmsReportTheSameErrors) {
  const struct {
    std::string program;
    std::string error;
  } kCases[] = {
      {B({'N', 'N', 'a'}), "cannot append to a None"},
      {B({'N', 'N', 'N', 's'}), "cannot set items on a None"},
      {B({'N', '(', 'N', 0x90}), "cannot add items to a None"},
      {B({'N', 'N', 'R'}), "arguments must be a tuple, got None"},
      {B({'N', ')', 'N', 0x92}),
       "needs a tuple and a dict, got tuple and None"},
      {B({'N', 'N', 'b'}), "cannot BUILD a None"},
      {B({'N', 'K', 1, 0x93}),
       "STACK_GLOBAL requires str module and name, got None and int"},
      {B({'(', 'N', 'd'}), "odd number of items for DICT"},
      {B({'}', '(', 'N', 'u'}), "odd number of items for SETITEMS"},
      {B({'(', 'o'}), "OBJ needs a class after the MARK"},
      {B({'t'}), "no MARK on the stack"},
      {B({'(', 'e'}), "no target value below the MARK"},
      {B({'N', 0x81}), "stack underflow: needs 2 values, 1 available"},
      {B({'N', '(', '0', '0', '0'}), "stack underflow: needs 1 value, 0"},
      {B({0x8b, 0xff, 0xff, 0xff, 0xff}), "negative byte count"},
      {B({0x80, 6}), "unsupported pickle protocol 6"},
      {B({0x95}) + LE(100, 8), "truncated: frame of 100 bytes, 0 left"},
      {B({'X'}) + LE(10, 4) + "a",
       "truncated: length 10 exceeds the 1 bytes left"},
      {"S'a\\'\n", "bad escape in STRING"},
      {"S'abc\n", "the STRING opcode argument must be quoted"},
      {"V\\u1\n", "bad \\u escape in UNICODE"},
      {"Fx\n", "bad float literal"},
      {"I12x\n", "bad integer literal (3 bytes)"},
      {"gx\n", "bad memo index"},
      {B({'N', 'h', 3}), "memo key 3 not found"},
      {"c\xff\nx\n", "GLOBAL name is not valid UTF-8"},
      {B({0x8c, 1, 0xff}), "string is not valid UTF-8"},
      {"P\xff\n", "persistent id is not valid UTF-8"},
      {std::string(4097, '('), "MARK depth limit of 4096 exceeded"},
      {std::string((1 << 20) + 1, 'N'), "stack depth limit of 1048576"},
      {B({'N', 0x82, 1}), "opcode 0x82 (EXT1): unsupported opcode"},
      {B({'N', 'N'}), "offset 2: unexpected end of data (no STOP opcode)"},
  };
  for (const auto& c : kCases) {
    const std::string parsed = ParseError(c.program);
    EXPECT_NE(parsed.find(c.error), std::string::npos)
        << parsed << "\nwant: " << c.error;
    EXPECT_EQ(parsed, DecodeError(c.program));
  }
}

}  // namespace
}  // namespace ckptd::pickle
