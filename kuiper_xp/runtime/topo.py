"""Topological order by depth-first search, reverse post-order (seed 002), without recursion."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from kuiper_xp.errors import GraphError

N = TypeVar("N", bound=Hashable)


def topological_order(
    nodes: Sequence[N],
    successors: Callable[[N], Iterable[N]],
    name: Callable[[N], str] = str,
) -> list[N]:
    """Seed 002's ``ReverseTopo``: from each unvisited node (in order), walk successors
    depth-first, append a node once all its successors are done, and reverse the result.

    Written with an explicit stack so a 10,000-op chain does not hit Python's recursion limit.
    A cycle raises :class:`GraphError` naming the nodes on it.
    """
    WHITE, GREY, BLACK = 0, 1, 2
    color: dict[N, int] = {n: WHITE for n in nodes}
    post: list[N] = []
    for root in nodes:
        if color[root] != WHITE:
            continue
        color[root] = GREY
        stack: list[tuple[N, Iterable[N]]] = [(root, iter(successors(root)))]
        while stack:
            node, it = stack[-1]
            for nxt in it:
                c = color.get(nxt)
                if c is None:
                    raise GraphError(f"{name(node)} links to {name(nxt)}, which is not in the graph")
                if c == WHITE:
                    color[nxt] = GREY
                    stack.append((nxt, iter(successors(nxt))))
                    break
                if c == GREY:
                    path = [name(n) for n, _ in stack]
                    cycle = path[path.index(name(nxt)):] + [name(nxt)]
                    raise GraphError("the graph has a cycle: " + " -> ".join(cycle))
            else:
                stack.pop()
                color[node] = BLACK
                post.append(node)
    post.reverse()
    return post
