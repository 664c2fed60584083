"""Topological sort (seed 002)."""

import pytest

from kuiper_xp.errors import GraphError
from kuiper_xp.runtime.topo import topological_order


def test_seed_worked_example():
    # seed 002: input -> op1 -> op3 -> {op4, op5}; op5 -> output. The seed walks it by hand and
    # gets (input, op1, op3, op5, output, op4).
    edges = {"input": ["op1"], "op1": ["op3"], "op3": ["op4", "op5"], "op4": [], "op5": ["output"],
             "output": []}
    order = topological_order(list(edges), lambda n: edges[n])
    assert order == ["input", "op1", "op3", "op5", "output", "op4"]


def test_two_orders_of_the_first_example_are_both_valid():
    edges = {"conv1": ["conv2", "conv3"], "conv2": [], "conv3": []}
    order = topological_order(list(edges), lambda n: edges[n])
    assert order[0] == "conv1" and set(order[1:]) == {"conv2", "conv3"}


def test_every_edge_goes_forward_on_a_random_dag():
    import random

    rnd = random.Random(3)
    nodes = list(range(200))
    edges = {n: sorted({rnd.randrange(n + 1, 200) for _ in range(3)} if n < 199 else set()) for n in nodes}
    rnd.shuffle(nodes)
    order = topological_order(nodes, lambda n: edges[n])
    pos = {n: i for i, n in enumerate(order)}
    assert len(order) == 200
    assert all(pos[a] < pos[b] for a in edges for b in edges[a])


def test_a_long_chain_needs_no_recursion():
    n = 10_000
    order = topological_order(list(range(n))[::-1], lambda i: [i + 1] if i + 1 < n else [])
    assert order == list(range(n))


def test_cycle_is_a_graph_error_naming_the_nodes():
    edges = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    with pytest.raises(GraphError, match="cycle: a -> b -> c -> a"):
        topological_order(list(edges), lambda n: edges[n])


def test_dangling_successor():
    with pytest.raises(GraphError, match="not in the graph"):
        topological_order(["a"], lambda n: ["zz"])
