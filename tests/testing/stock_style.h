// Copyright 2026 The ckptd Authors.
//
// Test helper: writes pickle programs in the shape CPython's pickler gives
// a stock DCP Metadata (protocol 4), opcode by opcode.
#ifndef CKPTD_TESTS_TESTING_STOCK_STYLE_H_
#define CKPTD_TESTS_TESTING_STOCK_STYLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ckptd::testing {

// A protocol-4 program in the shape CPython's pickler gives a stock
// Metadata: every object NEWOBJ + BUILD {field: value}, everything
// memoized (MEMOIZE), globals by STACK_GLOBAL, field names and fqns read
// back through BINGET/LONG_BINGET, frames of `frame_bytes` (64 KiB as
// CPython writes them; smaller ones split objects anywhere between opcodes).
class StockStyle {
 public:
  explicit StockStyle(size_t frame_bytes = 64 << 10)
      : frame_bytes_(frame_bytes) {}
  std::string Take() {
    CloseFrame();
    out_ += '.';
    return std::move(out_);
  }
  void Begin() {
    out_ = "\x80\x04";
    OpenFrame();
  }
  void Op(char c) {
    Room();
    buf_ += c;
  }
  void Memo() {
    Op('\x94');
    ++memo_;
  }
  void Str(const std::string& s) {
    auto it = memo_of_.find(s);
    if (it != memo_of_.end()) return Get(it->second);
    Room();
    if (s.size() < 256) {
      buf_ += '\x8c';
      buf_ += static_cast<char>(s.size());
    } else {
      buf_ += 'X';
      for (int k = 0; k < 4; ++k)
        buf_ += static_cast<char>(s.size() >> (8 * k));
    }
    buf_ += s;
    memo_of_[s] = memo_;
    Memo();
  }
  void Get(uint64_t slot) {
    Room();
    if (slot < 256) {
      buf_ += 'h';
      buf_ += static_cast<char>(slot);
    } else {
      buf_ += 'j';
      for (int k = 0; k < 4; ++k) buf_ += static_cast<char>(slot >> (8 * k));
    }
  }
  void Global(const std::string& module, const std::string& name) {
    const std::string key = module + "\n" + name;
    auto it = memo_of_.find(key);
    if (it != memo_of_.end()) return Get(it->second);
    Str(module);
    Str(name);
    Op('\x93');
    memo_of_[key] = memo_;
    Memo();
  }
  void Int(int64_t v) {
    Room();
    if (v >= 0 && v < 256) {
      buf_ += 'K';
      buf_ += static_cast<char>(v);
    } else {
      buf_ += 'J';
      for (int k = 0; k < 4; ++k) buf_ += static_cast<char>(v >> (8 * k));
    }
  }
  // LONG1: v as `n` little-endian two's-complement bytes.
  void Long1(int64_t v, int n = 8) {
    Room();
    buf_ += '\x8a';
    buf_ += static_cast<char>(n);
    for (int k = 0; k < n; ++k) {
      buf_ += static_cast<char>(k < 8 ? v >> (8 * k) : (v < 0 ? -1 : 0));
    }
  }
  uint64_t memo() const { return memo_; }
  void NewObj(const std::string& module, const std::string& name) {
    Global(module, name);
    Op(')');
    Op('\x81');
    Memo();
  }
  void Size(std::vector<int64_t> v) {
    Global("torch", "Size");
    for (int64_t x : v) Int(x);
    if (v.empty()) {
      Op(')');  // () is not memoized
    } else {
      Op(v.size() == 1 ? '\x85' : v.size() == 2 ? '\x86' : '\x87');
      Memo();
    }
    Op('\x85');
    Memo();
    Op('R');
    Memo();
  }

 private:
  void Room() {
    if (buf_.size() >= frame_bytes_) {
      CloseFrame();
      OpenFrame();
    }
  }
  void OpenFrame() { buf_.clear(); }
  void CloseFrame() {
    if (buf_.empty()) return;
    out_ += '\x95';
    for (int k = 0; k < 8; ++k)
      out_ += static_cast<char>(buf_.size() >> (8 * k));
    out_ += buf_;
    buf_.clear();
  }
  size_t frame_bytes_;
  std::string out_, buf_;
  uint64_t memo_ = 0;
  std::map<std::string, uint64_t> memo_of_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_STOCK_STYLE_H_
