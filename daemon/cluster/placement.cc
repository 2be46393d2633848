// Copyright 2026 The ckptd Authors.
#include "daemon/cluster/placement.h"

#include <algorithm>

namespace ckptd::daemon {
namespace {

bool SameDomain(const ClusterNode& a, const ClusterNode& b) {
  return !a.failure_domain.empty() && a.failure_domain == b.failure_domain;
}

}  // namespace

std::vector<ClusterNode> ReplicaHolders(std::vector<ClusterNode> nodes,
                                        int self, int k) {
  std::sort(nodes.begin(), nodes.end(),
            [](const ClusterNode& a, const ClusterNode& b) {
              return a.node < b.node;
            });
  std::vector<ClusterNode> out;
  auto at = std::find_if(nodes.begin(), nodes.end(),
                         [&](const ClusterNode& n) { return n.node == self; });
  if (at == nodes.end() || k <= 0) return out;
  const size_t me = static_cast<size_t>(at - nodes.begin());
  for (size_t step = 1; step < nodes.size() && static_cast<int>(out.size()) < k;
       ++step) {
    const ClusterNode& n = nodes[(me + step) % nodes.size()];
    if (n.node == self || SameDomain(n, nodes[me])) continue;
    out.push_back(n);
  }
  return out;
}

std::vector<ClusterNode> ReplicaSources(const std::vector<ClusterNode>& nodes,
                                        int self, int k) {
  std::vector<ClusterNode> out;
  for (const ClusterNode& n : nodes) {
    for (const ClusterNode& h : ReplicaHolders(nodes, n.node, k)) {
      if (h.node == self) out.push_back(n);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ClusterNode& a, const ClusterNode& b) {
              return a.node < b.node;
            });
  return out;
}

}  // namespace ckptd::daemon
