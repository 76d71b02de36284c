"""Which mixed precision a training run gets (``Trainer(amp=...)``, ``meshops train
--amp``), and the combinations that cannot work, refused before training starts.

Mixed precision is :func:`torch.autocast` over the forward pass of a float32 model:
matrix products and attention run in bfloat16 or float16, the parameters, the loss,
the decoding and the optimiser stay float32. Both half types run on CPU and CUDA
(every meshops layer has a path for them: the fused CPU kernel is float32/float64
only, so attention under autocast takes PyTorch's SDPA). float16 needs a gradient
scaler (small gradients underflow it); bfloat16 has float32's range and needs none.
"""

from __future__ import annotations

import torch

__all__ = ["AMP_CHOICES", "amp_dtype"]

#: Accepted names of the half types.
AMP_CHOICES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp16": torch.float16, "float16": torch.float16}


def amp_dtype(amp, device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """The autocast dtype for ``amp`` on ``device`` with a model of ``dtype``.

    Args:
        amp: ``False``/``None`` (off), ``True`` (bfloat16 on CPU and on GPUs that
            have it, else float16), or a name of :data:`AMP_CHOICES`.
        device: The training device.
        dtype: The model's parameter dtype.

    Returns:
        ``torch.bfloat16``, ``torch.float16`` or ``None`` (full precision).

    Raises:
        ValueError: an unknown name, a model that is not float32 (mixed precision
            lowers float32 work; a float64 model asked for exactness), bfloat16 on a
            GPU without bfloat16, or a device type autocast does not cover.
    """
    if amp is None or amp is False:
        return None
    if amp is not True and amp not in AMP_CHOICES:
        raise ValueError(f"amp must be True, False, 'bf16' or 'fp16', got {amp!r}")
    if dtype != torch.float32:
        raise ValueError(f"amp={amp!r} needs a float32 model, but its parameters are {dtype}: "
                         f"mixed precision lowers float32 work to 16 bits; train in float32 "
                         f"or without amp")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"amp={amp!r}: mixed precision is supported on cpu and cuda, not on "
                         f"{device.type}")
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if amp is True:
        return torch.bfloat16 if device.type == "cpu" or cuda_bf16 else torch.float16
    chosen = AMP_CHOICES[amp]
    if chosen == torch.bfloat16 and device.type == "cuda" and not cuda_bf16:
        raise ValueError(f"amp={amp!r}: this GPU ({torch.cuda.get_device_name(device)}) has no "
                         f"bfloat16; use amp='fp16'")
    return chosen
