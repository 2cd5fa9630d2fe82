"""Decoding rules as functions of text, tokens and passages: the relevance gate, where a copy
may start and which window answers, the repetition guard, the retrieval query of a
conversation, and alpha/tau calibration.

Imports ``corpus`` and ``core``.
"""
