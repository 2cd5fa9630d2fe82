"""Foundations: the configuration (``NestConfig``), the mixture arithmetic, the relevance
interface and its cosine, atomic and
checksummed files, JSON helpers and the integrations' standard parameter names.

Imports nothing else of the package.
"""
