"""norm layers."""
