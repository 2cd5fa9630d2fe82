"""The language model: loading (``load_lm``), the key reader and fingerprints, and the CPU
kernels of the shared step (masked grouped-head attention, pre-packed linear weights).

Imports only ``core``.
"""
