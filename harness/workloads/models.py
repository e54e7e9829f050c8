"""Models and synthetic inputs, built from configs with random weights (nothing is ever downloaded).

Profiles set input sizes only; the model is the same in both, so the gradient volume that DDP
communicates is unchanged and ``cpu`` runs measure the same communication as ``paper`` runs.

Assumptions (the paper does not state them; REPRODUCTION.md lists them):
  * ``paper``: ResNet50 at 224x224, batch 32 per GPU; BERT (base or large) sequence length 128, batch 8
    per GPU. The small test model uses 32x32 images, batch 32.
  * ``cpu``: ResNet50 at 64x64, batch 4; BERT-base sequence 32, batch 2; BERT-large sequence 32, batch 1;
    small model 16x16, batch 8. Chosen so one iteration takes around a second on a 2-core machine.
  * ``tiny-layers``: batch 2 in both profiles; its compute is negligible on purpose (host-bound, see the class).
Inputs are generated once per rank on its device (seeded by seed and rank) and reused every iteration, so
data generation is never timed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from harness.config import MODELS, PROFILES


@dataclass(frozen=True)
class InputSpec:
    batch_size: int
    image_size: int = 0  # vision models
    seq_len: int = 0  # BERT


INPUTS = {
    ("paper", "small"): InputSpec(32, image_size=32),
    ("paper", "resnet50"): InputSpec(32, image_size=224),
    ("paper", "resnet101"): InputSpec(32, image_size=224),
    ("paper", "bert-base"): InputSpec(8, seq_len=128),
    ("paper", "bert-large"): InputSpec(8, seq_len=128),
    ("cpu", "small"): InputSpec(8, image_size=16),
    ("cpu", "resnet50"): InputSpec(4, image_size=64),
    ("cpu", "resnet101"): InputSpec(4, image_size=64),
    ("cpu", "bert-base"): InputSpec(2, seq_len=32),
    ("cpu", "bert-large"): InputSpec(1, seq_len=32),
    ("paper", "tiny-layers"): InputSpec(2),
    ("cpu", "tiny-layers"): InputSpec(2),
}
TINY_WIDTH, TINY_DEPTH = 16, 400

NUM_CLASSES = {"small": 10, "resnet50": 1000, "resnet101": 1000}


class SmallNet(nn.Module):
    """Tiny conv net with a BatchNorm (so buffer broadcast is exercised) for fast tests."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


class TinyLayers(nn.Module):
    """400 ``Linear(16, 16)``: 800 parameters of 16 or 256 elements. An iteration is almost all per-gradient and
    per-bucket bookkeeping, the regime of BERT-base at batch 8 on a fast GPU, where the host issuing kernels and
    running DDP's hooks is slower than the device: it measures a DDP's host cost."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(TINY_WIDTH, TINY_WIDTH) for _ in range(TINY_DEPTH)))

    def forward(self, x):
        return self.layers(x)


def bert_config(name: str):
    from transformers import BertConfig

    if name == "bert-base":
        return BertConfig()  # 12 layers, hidden 768, 12 heads, ~110M parameters
    if name == "bert-large":
        return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    raise ValueError(f"unknown BERT model {name!r}")


def build_model(name: str) -> nn.Module:
    """A randomly initialised model; seed torch before calling for identical weights on every rank."""
    if name == "small":
        return SmallNet(NUM_CLASSES["small"])
    if name == "tiny-layers":
        return TinyLayers()
    if name in ("resnet50", "resnet101"):
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    if name in ("bert-base", "bert-large"):
        from transformers import BertForPreTraining

        return BertForPreTraining(bert_config(name))
    raise ValueError(f"unknown model {name!r}; choose one of {list(MODELS)}")


_built: dict[tuple[str, int], tuple[nn.Module, torch.Tensor]] = {}


def seeded_model(name: str, seed: int) -> nn.Module:
    """A new copy of the model ``torch.manual_seed(seed)`` then :func:`build_model` gives, with torch's random
    state left as that build leaves it. Each model is built once per process and copied afterwards: a pool's
    ranks run many points, and building BERT-base's random weights takes seconds, copying them a tenth."""
    if (name, seed) not in _built:
        torch.manual_seed(seed)
        model = build_model(name)
        _built[(name, seed)] = model, torch.get_rng_state()
    model, state = _built[(name, seed)]
    torch.set_rng_state(state)
    return copy.deepcopy(model)


def input_spec(name: str, profile: str, batch_size: int = 0) -> InputSpec:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {list(PROFILES)}")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {list(MODELS)}")
    spec = INPUTS[(profile, name)]
    return InputSpec(batch_size, spec.image_size, spec.seq_len) if batch_size > 0 else spec


def make_inputs(name: str, spec: InputSpec, device: torch.device, seed: int = 0) -> dict:
    """Synthetic batch as keyword arguments for :func:`compute_loss` (random ids, no tokenizer)."""
    gen = torch.Generator().manual_seed(seed)
    b = spec.batch_size
    if name == "tiny-layers":
        x = torch.randn(b, TINY_WIDTH, generator=gen)
        return {"x": x.to(device), "y": torch.randint(0, TINY_WIDTH, (b,), generator=gen).to(device)}
    if name in NUM_CLASSES:
        x = torch.randn(b, 3, spec.image_size, spec.image_size, generator=gen)
        y = torch.randint(0, NUM_CLASSES[name], (b,), generator=gen)
        return {"x": x.to(device), "y": y.to(device)}
    vocab = bert_config(name).vocab_size
    ids = torch.randint(0, vocab, (b, spec.seq_len), generator=gen)
    batch = {
        "input_ids": ids,
        "token_type_ids": (torch.arange(spec.seq_len) >= spec.seq_len // 2).long().expand(b, -1).contiguous(),
        "attention_mask": torch.ones(b, spec.seq_len, dtype=torch.long),
        "labels": ids.clone(),  # masked-LM targets: predict every token
        "next_sentence_label": torch.randint(0, 2, (b,), generator=gen),
    }
    return {k: v.to(device) for k, v in batch.items()}


def compute_loss(name: str, model: nn.Module, inputs: dict) -> torch.Tensor:
    """Forward pass plus loss; ``model`` may be wrapped in any DDP."""
    if name in NUM_CLASSES or name == "tiny-layers":
        return nn.functional.cross_entropy(model(inputs["x"]), inputs["y"])
    return model(**inputs).loss
