"""The smallest ``meshops train`` run that still has every random ingredient (a
shuffled, batched training set and a model with random initial weights), and the
check of a CLI error line; shared by the reproducibility and error tests."""

from __future__ import annotations


def tiny_args(epochs: int = 1) -> list[str]:
    """``train`` flags (without ``--data``/``--out``) for a run of a few seconds."""
    return ["--inputs", "f", "--targets", "u", "--model", "transformer_no", "--model-config",
            "width=8", "layers=1", "heads=2", "--epochs", str(epochs), "--batch-size", "2"]


def one_line_error(err: str) -> bool:
    """``err`` is one line ``meshops: error: ...`` and no traceback."""
    return err.startswith("meshops: error: ") and err.count("\n") == 1 and "Traceback" not in err


def checkpoint_tensors(path) -> dict:
    """Every tensor of a checkpoint (the weights and the normalisers), by its path in
    the checkpoint: two runs trained alike give equal ones, tensor for tensor."""
    import torch

    out = {}

    def walk(prefix, v):
        if isinstance(v, torch.Tensor):
            out[prefix] = v
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}", x)

    walk("", torch.load(path, weights_only=True))
    return out
