"""conv layers."""
