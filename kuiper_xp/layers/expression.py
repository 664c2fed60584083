"""expression layers."""
