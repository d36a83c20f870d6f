"""Bugs planted in a component's exported graph only, never in its reference.

A component's `module` (the export wrapper) shares its submodules and parameters with the eager
model its `reference` runs. Each bug here returns a copy of the component whose module is a *fork*:
the modules on the path to the changed part are shallow copies with their own child, parameter and
buffer tables, so the eager model (and with it the reference and every scheme reference) is left
as it was, and the parameters stay the same tensors (the scheme reference swaps stored weights in
by identity or by content). Forked modules get a class named `Planted...`, so nothing keyed on the
module's content or class reuses a faithful graph for them.

Bugs (each checked to change the module's own output on the component's example inputs):
- `head_dropped`: one head of the first attention layer is zeroed before its output projection;
- `rope_base`: the graph's RoPE (frequencies or cos / sin tables) for a base 40 % above the model's;
- `noise_ignored`: a sampling graph that ignores its `noise` input (greedy whatever is asked);
- `euler_zeroed`: one step of a denoising loop adds no velocity (a flow-matching Euler step, or a
  DDIM step whose noise prediction is zero);
- `unnorm_skipped`: an action graph that returns normalized actions (its unnormalization skipped).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from edgex.component import Component

ROPE_FACTOR = 1.4


class NotApplicable(Exception):
    """The component has no part the bug can be planted in."""


def fork(module: nn.Module, **methods) -> nn.Module:
    """A shallow copy of `module` with its own child / parameter / buffer tables (the same tensors
    and children), as a `Planted<class>` subclass overriding `methods`."""
    new = copy.copy(module)
    new._modules, new._parameters, new._buffers = dict(module._modules), dict(module._parameters), dict(module._buffers)
    new.__class__ = type(f"Planted{type(module).__name__}", (type(module),), methods)
    return new


def replaced(root: nn.Module, path: str, make: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """`root` with the submodule at dotted `path` replaced by `make(it)`, every module on the way forked."""
    if not path:
        return make(root)
    head, _, rest = path.partition(".")
    new = fork(root)
    new._modules[head] = replaced(root._modules[head], rest, make)
    return new


def _head_dim(attn: nn.Module, width: int) -> int:
    for source in (attn, getattr(attn, "config", None)):
        dim = getattr(source, "head_dim", None)
        if isinstance(dim, int) and dim > 0:
            return dim
    heads = getattr(attn, "num_heads", None)
    if isinstance(heads, int) and heads > 0:
        return width // heads
    raise NotApplicable(f"{type(attn).__name__}: no head_dim")


def _head_masked(linear: nn.Linear, head_dim: int, head: int) -> nn.Module:
    """The projection with one head's slice of its input zeroed (the head's output dropped)."""
    mask = torch.ones(linear.in_features)
    mask[head * head_dim:(head + 1) * head_dim] = 0.0

    def forward(self, x):
        return F.linear(x * self.planted_mask.to(x.dtype), self.weight, self.bias)

    new = fork(linear, forward=forward)
    new.register_buffer("planted_mask", mask, persistent=False)
    return new


def head_dropped(component: Component) -> nn.Module:
    """Head 0 of the first attention layer the graph calls (the first output projection whose
    dropped head changes the graph's outputs: a wrapper may hold layers it never runs)."""
    module = component.module
    modules = dict(module.named_modules(remove_duplicate=False))
    for name, sub in modules.items():
        leaf = name.rpartition(".")[2]
        if leaf in ("o_proj", "out_proj") and isinstance(sub, nn.Linear):
            dim = _head_dim(modules[name.rpartition(".")[0]], sub.in_features)
            planted = replaced(module, name, lambda linear: _head_masked(linear, dim, 0))
            if _changes(component, planted):
                return planted
    raise NotApplicable("no attention output projection (o_proj / out_proj) the graph calls")


def _slower(inv_freq: torch.Tensor) -> torch.Tensor:
    """Frequencies theta^(-i/n), i < n, for theta x 1.4: each times 1.4^(-i/n)."""
    n = inv_freq.shape[-1]
    return inv_freq * ROPE_FACTOR ** (-torch.arange(n, dtype=inv_freq.dtype) / n)


def _is_rope(sub: nn.Module, key: str) -> bool:
    """A buffer `edgex.nn.transformer.register_rope` gives: a frequency vector (`*inv_freq`) or the
    cos half of a cos / sin table pair (`<name>_cos`, `<name>_sin`)."""
    return "inv_freq" in key or (key.endswith("_cos") and key.removesuffix("_cos") + "_sin" in sub._buffers)


def rope_base(module: nn.Module) -> nn.Module:
    """Every RoPE the graph owns for theta x 1.4: its frequency vectors (`*inv_freq` buffers:
    theta^(-i/n), i < n) each times 1.4^(-i/n), its cos / sin tables rebuilt from their frequencies
    so changed (a table's frequencies are its angles at position 1)."""
    from edgex.nn.transformer import rope_table

    owners = [(name, sub) for name, sub in module.named_modules(remove_duplicate=False)
              if any(_is_rope(sub, b) for b in sub._buffers)]
    if not owners:
        raise NotApplicable("the graph owns no RoPE frequencies")
    for name, _ in owners:
        def make(sub):
            new = fork(sub)
            for key, table in list(sub._buffers.items()):
                if "inv_freq" in key:
                    new._buffers[key] = _slower(table)
                elif _is_rope(sub, key):
                    stem, half = key.removesuffix("_cos"), table.shape[-1] // 2
                    sin = sub._buffers[stem + "_sin"]
                    freqs = torch.atan2(sin[1, :half].double(), table[1, :half].double())
                    new._buffers[stem + "_cos"], new._buffers[stem + "_sin"] = rope_table(_slower(freqs), table.shape[0])
            return new
        module = replaced(module, name, make)
    return module


def noise_ignored(module: nn.Module, index: int) -> nn.Module:
    def forward(self, *inputs):
        inputs = list(inputs)
        inputs[index] = inputs[index] * 0.0
        return type(module).forward(self, *inputs)

    return fork(module, forward=forward)


def _zeroed_on_step(self, out):
    """`out` as it is, or zeros (the first tensor of a tuple) on the `planted_step`-th call since the
    loop's forward began (the counter lives on the forked module: a deep copy keeps it working)."""
    self.planted_calls += 1
    if self.planted_calls - 1 != self.planted_step:
        return out
    if isinstance(out, tuple):
        return (torch.zeros_like(out[0]), *out[1:])
    return torch.zeros_like(out)


def euler_zeroed(module: nn.Module) -> nn.Module:
    """The velocity (or noise prediction) of the middle step of the loop zeroed. The loop's per-step
    callee is its step module's `velocity` method (SmolVLA, pi0), its own `velocity` DiT (Token2wav's
    flow) or its `unet` (Diffusion Policy's DDIM)."""
    steps = _loop_steps(module)
    step = module._modules.get("step")
    if isinstance(step, nn.Module) and hasattr(step, "velocity"):
        name, method = "step", "velocity"
    else:
        name = next((n for n in ("velocity", "unet") if isinstance(module._modules.get(n), nn.Module)), None)
        method = "forward"
        if name is None:
            raise NotApplicable("no per-step velocity in this graph")
    original = module._modules[name]

    def counted(self, *args, **kwargs):
        return _zeroed_on_step(self, getattr(type(original), method)(self, *args, **kwargs))

    inner = fork(original, **{method: counted})
    inner.planted_step, inner.planted_calls = steps // 2, 0

    def forward(self, *inputs):
        self._modules[name].planted_calls = 0
        return type(module).forward(self, *inputs)

    loop = fork(module, forward=forward)
    loop._modules[name] = inner
    return loop


def _loop_steps(module: nn.Module) -> int:
    """Steps of a loop graph: its baked time embeddings (SmolVLA, pi0) or its schedule."""
    if "time_emb" in module._buffers:
        return module._buffers["time_emb"].shape[0]
    schedule = getattr(module, "schedule", None)
    if isinstance(schedule, list) and schedule:
        return len(schedule)
    raise NotApplicable("not a loop graph")


def unnorm_skipped(module: nn.Module) -> nn.Module:
    for name in ("action_unnorm", "unnorm"):
        if isinstance(module._modules.get(name), nn.Module):
            new = fork(module)
            new._modules[name] = nn.Identity()
            return new
    raise NotApplicable("the graph owns no action unnormalization")


def _noise(component: Component) -> Callable[[nn.Module], nn.Module]:
    names = [s.name for s in component.inputs]
    if not any(s.sampled_from and s.sampled_from[1] in names for s in component.outputs):
        raise NotApplicable("no sampling noise input")
    (index,) = {names.index(s.sampled_from[1]) for s in component.outputs if s.sampled_from and s.sampled_from[1] in names}
    return lambda module: noise_ignored(module, index)


BUGS: dict[str, Callable[[Component], nn.Module]] = {
    "head_dropped": head_dropped,
    "rope_base": lambda c: rope_base(c.module),
    "noise_ignored": lambda c: _noise(c)(c.module),
    "euler_zeroed": lambda c: euler_zeroed(c.module),
    "unnorm_skipped": lambda c: unnorm_skipped(c.module),
}


def plant(component: Component, bug: str) -> Component:
    """The component with `bug` in its export wrapper only; its reference unchanged. Raises
    `NotApplicable` where the component has nothing the bug applies to, AssertionError where the
    planted module computes what the faithful one does (the bug would test nothing)."""
    module = BUGS[bug](component).eval()
    assert _changes(component, module), f"{component.name}: planting {bug} changed none of its outputs on its samples"
    return replace(component, module=module, _reference_outputs=component._reference_outputs)


def _changes(component: Component, planted: nn.Module) -> bool:
    """Whether `planted` computes other outputs than the component's module on some sample."""
    return any(_differs(component.module, planted, inputs) for inputs in (component.example_inputs, *component.samples.values()))


def _differs(faithful: nn.Module, planted: nn.Module, inputs) -> bool:
    with torch.no_grad():
        before, after = faithful(*inputs), planted(*inputs)
    before, after = (x if isinstance(x, (tuple, list)) else (x,) for x in (before, after))
    return any(not torch.equal(a, b) for a, b in zip(before, after))


# GGUF files hold no graph: llama.cpp builds its own from the file's architecture and metadata. The
# same bugs are written into the file instead, where they reach llama.cpp's graph: the RoPE base
# in its metadata, a dropped head as that head's input columns of layer 0's output projection.
GGUF_BLOCK = {"Q8_0": (32, 34), "Q4_0": (32, 18)}  # ggml type -> (values, bytes) per block, fp16 scale first


def plant_gguf(path, bug: str) -> None:
    """Write `bug` into the GGUF file at `path`, in place."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path), "r+")
    fields = reader.fields
    if bug == "rope_base":
        names = [n for n in fields if n.endswith(".rope.freq_base")]
        if not names:
            raise NotApplicable("no rope.freq_base in the file")
        for name in names:
            fields[name].parts[-1][0] *= ROPE_FACTOR
    elif bug == "head_dropped":
        dim = int(next(fields[n].parts[-1][0] for n in fields if n.endswith(".attention.key_length")))
        tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_output.weight")
        kind = tensor.tensor_type.name
        if kind in ("F16", "F32"):
            tensor.data[:, :dim] = 0
        elif kind in GGUF_BLOCK:  # each value of the head's columns set to its block's zero code
            values, size = GGUF_BLOCK[kind]
            blocks = tensor.data.reshape(tensor.data.shape[0], -1, size)
            for i in range(dim):
                block, j = divmod(i, values)
                if kind == "Q8_0":  # fp16 scale, then one int8 per value
                    blocks[:, block, 2 + j] = 0
                else:  # fp16 scale, then value j in the low nibble of byte j % 16 (j < 16), else the high one; code 8 is 0
                    byte = blocks[:, block, 2 + j % 16]
                    blocks[:, block, 2 + j % 16] = (byte & 0xF0) | 8 if j < 16 else (byte & 0x0F) | 0x80
        else:
            raise NotApplicable(f"attn_output stored as {kind}")
    else:
        raise NotApplicable(f"{bug} has no GGUF form")
    reader.data.flush()
