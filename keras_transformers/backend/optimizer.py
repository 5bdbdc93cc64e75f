"""The optimizer update on PyTorch: all variables at once, in place
(`adam_update`)."""

from __future__ import annotations

from keras_transformers.backend import _torch_tensor


def adam_update(
    variables, gradients, momentums, velocities, learning_rate, step, betas, epsilon
):
    """One Adam step on PyTorch for all `variables` at once, in place:
    `m += (1 - beta_1) (g - m)`, `v = beta_2 v + (1 - beta_2) g^2`,
    `variable -= m / ((sqrt(v) + eps) / alpha)` with
    `alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)` (Keras' Adam; `step` = t).

    Multi-tensor (`torch._foreach_*`) kernels, one launch per operation for
    a whole group of same-dtype variables where a per-variable loop makes one
    per variable (hundreds per step on a GPU), and one temporary per
    variable where Keras' PyTorch Adam makes five (each a fresh allocation,
    page-faulted in on CPU). No host sync (`alpha` stays a tensor). PyTorch
    only: other backends keep Keras' update, which XLA fuses anyway."""
    import torch

    beta_1, beta_2 = betas
    groups = {}  # foreach kernels take one dtype and device per list
    for var, g, m, v in zip(variables, gradients, momentums, velocities):
        value = var.value
        group = groups.setdefault((value.dtype, value.device), ([], [], [], []))
        for items, item in zip(group, (value, _torch_tensor(g), m.value, v.value)):
            items.append(item)
    with torch.no_grad():
        t = _torch_tensor(step)
        lr = _torch_tensor(learning_rate)
        for (dtype, device), (var, g, m, v) in groups.items():
            g = [x.to(dtype) for x in g]
            tt, lr_ = t.to(device, dtype), lr.to(device, dtype)
            alpha = lr_ * torch.sqrt(1 - beta_2**tt) / (1 - beta_1**tt)
            torch._foreach_lerp_(m, g, 1 - beta_1)
            torch._foreach_mul_(v, beta_2)
            torch._foreach_addcmul_(v, g, g, value=1 - beta_2)
            denominator = torch._foreach_sqrt(v)
            torch._foreach_add_(denominator, epsilon)
            torch._foreach_div_(denominator, alpha)
            torch._foreach_addcdiv_(var, m, denominator, value=-1)
