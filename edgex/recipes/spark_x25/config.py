"""Spark-X2.5 configuration: the published 1.7B values, a tiny test preset, and config.json keys.

Layer types come from `layer_types` when a config has it (docs/models.md: read it, do not assume it);
otherwise the published 3:1 rule applies (layer i is full attention when (i + 1) % 4 == 0).
The tiny preset keeps the real vocabulary, head layout ratios, RoPE split and the 3:1 pattern and
shrinks widths, depth and the window (16) so tests cross the window several times in seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ...errors import EdgexError

SLIDING = "sliding_attention"
FULL = "full_attention"


def default_layer_types(layers: int) -> tuple[str, ...]:
    return tuple(FULL if (i + 1) % 4 == 0 else SLIDING for i in range(layers))


@dataclass(frozen=True)
class SparkConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    sliding_window: int  # positions a sliding query sees, itself included
    layer_types: tuple[str, ...] = ()
    sliding_rope_theta: float = 1.0e4
    full_rope_theta: float = 5.0e6
    full_partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1.0e-6

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", default_layer_types(self.num_hidden_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        bad = sorted(set(self.layer_types) - {SLIDING, FULL})
        if bad or len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types must list {self.num_hidden_layers} of {SLIDING}/{FULL}, got {bad or len(self.layer_types)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == SLIDING]

    @property
    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    @classmethod
    def from_dict(cls, data: dict) -> "SparkConfig":
        """From a config.json; keys this model does not use (architectures, dtype ...) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return {**asdict(self), "layer_types": list(self.layer_types)}


@dataclass(frozen=True)
class SparkPreset:
    name: str
    config: SparkConfig
    prefill: int  # tokens per prefill call
    context: int  # full-attention KV slots
    description: str


PRESETS: dict[str, SparkPreset] = {
    p.name: p
    for p in (
        SparkPreset(
            "tiny",
            SparkConfig(131072, 64, 192, 4, 4, 2, 32, sliding_window=16),
            prefill=12,
            context=128,
            description="real vocabulary and 3:1 sliding/full layout, 4 layers, window 16; seconds to export",
        ),
        SparkPreset(
            "1.7b",
            SparkConfig(131072, 2048, 6656, 28, 8, 2, 256, sliding_window=512),
            prefill=128,
            context=1024,
            description="Spark-X2.5-1.7B configuration, seeded random weights",
        ),
    )
}

# Graph sizes for a checkpoint (the real model): 128-token prefill chunks, 1k context.
CHECKPOINT_PREFILL, CHECKPOINT_CONTEXT = 128, 1024


def get_preset(name: str) -> SparkPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise EdgexError(f"no such preset {name!r} for spark-x2.5 (known: {', '.join(PRESETS)})") from None
