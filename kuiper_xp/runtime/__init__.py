"""The runtime graph: build stages, topological order, memory plan, executor."""

from .graph import Graph, GraphState, TensorSpec, load
from .topo import topological_order

__all__ = ["Graph", "GraphState", "TensorSpec", "load", "topological_order"]
