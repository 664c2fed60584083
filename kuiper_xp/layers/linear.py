"""linear layers."""
