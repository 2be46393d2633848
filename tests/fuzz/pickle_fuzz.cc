// Copyright 2026 The ckptd Authors.
//
// libFuzzer target for the pickle reader: parses the input with small limits,
// then walks the resulting graph (bounded, cycle-safe) through DebugString and
// the typed accessors. Seed corpus: tests/fuzz/corpus/pickle/.
//
//   build-fuzz/fuzz/pickle_fuzz -max_total_time=60 tests/fuzz/corpus/pickle
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "format/pickle/pickle.h"

namespace {

using ckptd::pickle::Value;

void Touch(const Value& v) {
  // Results are ignored; the point is that none of this crashes or hangs.
  (void)ckptd::pickle::AsInt(v);
  (void)ckptd::pickle::AsString(v);
  (void)ckptd::pickle::AsIntVector(v);
  (void)ckptd::pickle::AsBytes(v);
  (void)ckptd::pickle::KindName(v.kind);
  (void)v.Get("storage");
  (void)v.IsGlobal("torch", "Size");
  (void)v.IsCallTo("collections", "OrderedDict");
  (void)ckptd::pickle::DebugString(v, 3, 200);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptd::pickle::ReaderOptions options;
  options.max_alloc_bytes = 16 << 20;
  options.max_string_bytes = 1 << 20;
  options.max_stack_depth = 10000;
  options.max_mark_depth = 100;
  options.max_memo_entries = 10000;
  options.source_name = "fuzz";
  auto doc = ckptd::pickle::Parse(
      std::string_view(reinterpret_cast<const char*>(data), size), options);
  if (!doc.ok()) {
    const absl::StatusCode code = doc.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kResourceExhausted) {
      __builtin_trap();
    }
    return 0;
  }
  const uint64_t allocated = (*doc)->allocated_bytes();
  if (allocated > options.max_alloc_bytes) __builtin_trap();

  const Value& root = (*doc)->root();
  (void)ckptd::pickle::DebugString(root);
  // Breadth-first over at most 2000 distinct values.
  absl::flat_hash_set<const Value*> seen;
  std::vector<const Value*> queue = {&root};
  for (size_t head = 0; head < queue.size() && seen.size() < 2000; ++head) {
    const Value* v = queue[head];
    if (v == nullptr || !seen.insert(v).second) continue;
    Touch(*v);
    if (queue.size() > 20000) continue;
    for (const Value* item : v->items) queue.push_back(item);
    for (const auto& [k, val] : v->entries) {
      queue.push_back(k);
      queue.push_back(val);
    }
    for (const Value* p : {v->callable, v->args, v->kwargs, v->state, v->pid}) {
      if (p != nullptr) queue.push_back(p);
    }
  }
  return 0;
}
