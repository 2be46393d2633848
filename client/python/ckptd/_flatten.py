"""DCP 2.4+ state-dict flattening (dcp-format.md §4.1), reproduced exactly so
that a checkpoint ckptd writes has the keys stock `dcp.load` computes from
the same state dict, and `planner_data` holds the same paths.

Rules (torch/distributed/checkpoint/_traverse.py, 2.4+ semantics):
  * mappings are always descended; their keys become str(k) in the path;
  * a list is descended (with integer path items) only if some element is a
    tensor, or a mapping, or a list that is itself descended; otherwise it is
    a leaf, as is every tuple and every other value;
  * the flat key is ".".join(str(p) for p in path); duplicates are an error.

Unlike torch's flatten_state_dict, `flatten` also returns, for every leaf,
the container that holds it and the key *object* there (an int key stays an
int), so a loader can replace values in place without going through the
stringified path. `is_stateful` is DCP's test for the objects that save and
load replace by their state_dict() (the top level of a state dict only).
"""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Leaf:
    fqn: str
    path: tuple       # DCP planner_data path: str keys, int list indices
    value: Any
    container: Any    # the dict or list holding the value
    key: Any          # its key / index in that container


def _is_terminal(value):
    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    for entry in value:
        if isinstance(entry, (Mapping, list)) and not _is_terminal(entry):
            return False
        if isinstance(entry, torch.Tensor):
            return False
    return True


def flatten(state_dict):
    """Returns the leaves of `state_dict` in DCP's traversal order. Raises
    ValueError on a duplicated flat key (as DCP does)."""
    leaves = []
    seen = set()

    def visit(path, value, container, key):
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(path + (str(k),), v, value, k)
        elif _is_terminal(value):
            fqn = ".".join(str(p) for p in path)
            if fqn in seen:
                raise ValueError(f"duplicated flatten key {fqn}")
            seen.add(fqn)
            leaves.append(Leaf(fqn, path, value, container, key))
        else:  # a non-terminal list
            for i, v in enumerate(value):
                visit(path + (i,), v, value, i)

    for key, value in state_dict.items():
        visit((str(key),), value, state_dict, key)
    return leaves


def flatten_state_dict(state_dict):
    """torch's (flat_dict, mappings) pair, for comparison with
    torch.distributed.checkpoint._nested_dict.flatten_state_dict."""
    flat, mappings = {}, {}
    for leaf in flatten(state_dict):
        flat[leaf.fqn] = leaf.value
        mappings[leaf.fqn] = leaf.path
    return flat, mappings


def is_stateful(value):
    """DCP's Stateful protocol: anything with state_dict and load_state_dict."""
    return (not isinstance(value, torch.Tensor) and callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None)))
