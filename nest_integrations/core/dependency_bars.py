"""The progress bars of the libraries the package loads models with, kept off around its own loads.

Loading the LM or the embedder makes transformers draw bars of its own steps ("Loading
weights", "Writing model shards" and "Converting and de-quantizing GGUF tensors" when the
default LM's GGUF is converted once) and huggingface_hub draw its download bars. To a
user those are steps of one phase they did not ask about by name; the package shows one bar
per phase it runs (embedding passages, encoding the datastore, calibrating), each with an
estimate, and keeps the libraries' bars off while it loads (:func:`dependency_bars_off`).

With the package logging at INFO (``nest -v``, or an application that set it) the bars are
left as they are: a verbose run shows everything.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

PACKAGE_LOGGER = "nest_integrations"


@contextmanager
def dependency_bars_off() -> Iterator[None]:
    """Turn transformers' and huggingface_hub's progress bars off for the block, then back to
    what they were (a caller that had them off keeps them off). Not thread-safe in the libraries
    either: both switches are process-wide."""
    if logging.getLogger(PACKAGE_LOGGER).isEnabledFor(logging.INFO):
        yield
        return
    import transformers.utils.logging as transformers_logging
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_was_on = not are_progress_bars_disabled()
    transformers_was_on = transformers_logging.is_progress_bar_enabled()
    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hub_was_on:
            enable_progress_bars()
        if transformers_was_on:
            transformers_logging.enable_progress_bar()
