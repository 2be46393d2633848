// Copyright 2026 The ckptd Authors.
//
// Where the replicas of a node's share of a checkpoint go (peer_replicas,
// docs/restore.md "Peer replicas"): a ring over the checkpoint's nodes in
// ascending node id (lowest global rank). Node n's share goes to the first
// `k` nodes after n on the ring whose failure domain is not n's (a node
// without one is a domain of its own). With fewer such nodes, fewer
// replicas (the caller logs it). The rule is the same on every node, so
// each node knows whose shares it may receive and a restoring node whose
// holders are. Pure functions.
#ifndef CKPTD_DAEMON_CLUSTER_PLACEMENT_H_
#define CKPTD_DAEMON_CLUSTER_PLACEMENT_H_

#include <vector>

#include "daemon/cluster/cluster.h"

namespace ckptd::daemon {

// The nodes that hold replicas of node `self`'s share, in ring order.
// Empty when `self` is not among `nodes` or k <= 0.
std::vector<ClusterNode> ReplicaHolders(std::vector<ClusterNode> nodes,
                                        int self, int k);

// The nodes whose shares node `self` holds (the inverse of ReplicaHolders
// with the same k), ascending.
std::vector<ClusterNode> ReplicaSources(const std::vector<ClusterNode>& nodes,
                                        int self, int k);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_PLACEMENT_H_
