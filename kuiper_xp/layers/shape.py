"""shape layers."""
