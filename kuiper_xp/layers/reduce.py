"""reduce layers."""
