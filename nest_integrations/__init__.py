"""NEST."""
