"""Reading the hidden states NEST uses as datastore keys.

:class:`KeyReader` captures the hidden representation at a configurable layer
during an ordinary forward pass, so that datastore encoding and decoding read
keys and queries from exactly the same place.

Key layers (``key_layer``):

``"ffn_input"``
    Input of the last decoder layer's feed-forward block, after its layer norm
    (the kNN-LM choice the NEST paper names): the output of
    ``pre_feedforward_layernorm`` (Gemma) or, in llama-style layers, of
    ``post_attention_layernorm``.
``"layer:i"``
    Output of decoder layer ``i`` (Python indexing, ``layer:-2`` is the
    second-to-last layer, the choice of the authors' code). Equals
    ``outputs.hidden_states[i]`` for negative ``i`` and ``hidden_states[i + 1]``
    for non-negative ``i``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _decoder_layers(model: Any) -> Any | None:
    """The list of decoder layers of llama-style models, or None."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for holder in (decoder, getattr(model, "model", None), model):
        layers = getattr(holder, "layers", None)
        if layers is not None and len(layers) > 0:
            return layers
    return None


def parse_key_layer(key_layer: str) -> tuple[str, int]:
    """Split a key-layer spec into (kind, index): ``"ffn_input"`` -> ("ffn_input", -1).

    Raises:
        ValueError: unknown spec.
    """
    if key_layer == "ffn_input":
        return "ffn_input", -1
    if key_layer.startswith("layer:"):
        try:
            return "layer", int(key_layer.split(":", 1)[1])
        except ValueError:
            pass
    raise ValueError(f"key_layer must be 'ffn_input' or 'layer:<int>' (e.g. 'layer:-2'), got {key_layer!r}")


class KeyReader:
    """Captures the hidden state at ``key_layer`` during forward passes of ``model``.

    Usage::

        reader = KeyReader(model, "ffn_input")
        with reader.capture() as keys:
            out = model(input_ids)
        keys.value  # (batch, seq, hidden) tensor, same dtype as the model

    For llama-style models a forward hook reads the module output, so no extra
    hidden states are materialised. Other models fall back to
    ``output_hidden_states=True`` for ``layer:i`` (call :meth:`forward_kwargs`).
    """

    def __init__(self, model: Any, key_layer: str = "ffn_input"):
        self.kind, self.index = parse_key_layer(key_layer)
        self.key_layer = key_layer
        self.model = model
        layers = _decoder_layers(model)
        self._module = None
        if layers is not None:
            num_layers = len(layers)
            if not -num_layers <= self.index < num_layers:
                raise ValueError(f"key_layer {key_layer!r} is out of range for a model with {num_layers} layers")
            layer = layers[self.index]
            if self.kind == "ffn_input":
                # Gemma-style layers norm the attention output (post_attention_layernorm)
                # before the residual and the FFN input after it (pre_feedforward_layernorm);
                # llama-style layers have only the latter, under the former's name.
                self._module = getattr(layer, "pre_feedforward_layernorm", None) or getattr(
                    layer, "post_attention_layernorm", None
                )
                if self._module is None:
                    raise ValueError(
                        f"key_layer 'ffn_input' needs a llama-style layer with a post-attention norm; "
                        f"{type(layer).__name__} has none. Use 'layer:-2' instead."
                    )
            else:
                self._module = layer
        elif self.kind == "ffn_input":
            raise ValueError(
                f"{type(model).__name__} exposes no decoder layers, so 'ffn_input' keys cannot be read; "
                "use 'layer:<i>' (read from output_hidden_states)."
            )

    def forward_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments the forward call needs (hidden states fallback)."""
        return {} if self._module is not None else {"output_hidden_states": True}

    @contextmanager
    def capture(self) -> Iterator["_Captured"]:
        captured = _Captured()
        if self._module is None:
            yield captured
            return

        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            captured.value = output[0] if isinstance(output, tuple) else output

        handle = self._module.register_forward_hook(hook)
        try:
            yield captured
        finally:
            handle.remove()

    def keys_from(self, captured: "_Captured", outputs: Any) -> "torch.Tensor":
        """The captured keys, shape (batch, seq, hidden)."""
        if captured.value is not None:
            return captured.value
        hidden = getattr(outputs, "hidden_states", None)
        if hidden is None:
            raise ValueError(f"{type(self.model).__name__} returned no hidden states; cannot read keys")
        return hidden[self.index] if self.index < 0 else hidden[self.index + 1]


@dataclass
class _Captured:
    value: Any = None
