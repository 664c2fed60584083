"""resize layers."""
