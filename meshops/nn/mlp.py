"""Pointwise multilayer perceptron (:class:`MLP`) and the activations by name."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["MLP", "make_activation"]

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


def make_activation(name: str) -> nn.Module:
    """``"gelu"``, ``"relu"``, ``"silu"`` or ``"tanh"`` as a module."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class MLP(nn.Module):
    """Pointwise MLP ``Linear -> σ -> … -> Linear`` (``layers`` linear layers).

    Applied row by row, so it is trivially discretisation independent.

    Args:
        in_channels, hidden_channels, out_channels: widths.
        layers: number of linear layers (``>= 1``; ``1`` is a plain linear map).
        activation: ``"gelu"`` (default), ``"relu"``, ``"silu"`` or ``"tanh"``.
        out_activation: apply the activation after the last layer too.

    Shapes:
        ``[N, in_channels] -> [N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 layers: int = 2, activation: str = "gelu", out_activation: bool = False) -> None:
        super().__init__()
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers must be an integer >= 1, got {layers!r}")
        widths = [in_channels] + [hidden_channels] * (layers - 1) + [out_channels]
        mods: list[nn.Module] = []
        for i in range(layers):
            mods.append(nn.Linear(widths[i], widths[i + 1]))
            if i < layers - 1 or out_activation:
                mods.append(make_activation(activation))
        self.net = nn.Sequential(*mods)
        self.in_channels, self.out_channels = in_channels, out_channels

    def reset_parameters(self) -> None:
        for m in self.net:
            if isinstance(m, nn.Linear):
                m.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
