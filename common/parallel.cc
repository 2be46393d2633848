// Copyright 2026 The ckptd Authors.
#include "common/parallel.h"

#include <system_error>
#include <thread>
#include <vector>

namespace ckptd {

void RunOnThreads(int threads, const std::function<void()>& work) {
  std::vector<std::thread> pool;
  if (threads > 1) pool.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) {
    // std::thread reports a failed start by exception (the only one we
    // catch): work with the threads we have.
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace ckptd
