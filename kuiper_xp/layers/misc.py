"""misc layers."""
