"""What `SASAttnKernel` needs from a method runtime that wraps one stateful decoder (Saap's
`SaapDecoder`, SANTA's `SantaDecoder`): reset, the state (None before the first prompt), the
length, prefill and decode, each forwarded to `self.decoder`. A method's runtime subclasses it
and builds its decoder from the plan."""

from __future__ import annotations

from typing import Any

import torch


class DecoderRuntime:
    """Forwards the stateful-kernel protocol of `SASAttnKernel` to `self.decoder`."""

    decoder: Any

    def reset(self) -> None:
        self.decoder.reset()

    @property
    def state(self) -> Any:
        """The decoder once a prompt has filled its cache, else None."""
        return self.decoder if self.decoder.k is not None else None

    @property
    def length(self) -> int:
        return self.decoder.length

    @length.setter
    def length(self, value: int) -> None:
        self.decoder.length = value

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        return self.decoder.prefill(q, k, v, **extra)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        return self.decoder.decode(q, k, v, **extra)


__all__ = ["DecoderRuntime"]
