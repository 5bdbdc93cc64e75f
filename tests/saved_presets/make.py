"""Writes the presets of `tests/test_saved_presets_load.py`: tiny models of
every family saved with the keras_transformers on the path, and their
outputs on the test's fixed inputs (`outputs.npz`).

    KERAS_BACKEND=jax PYTHONPATH=<a checkout> python tests/saved_presets/make.py OUT
"""

import sys
from pathlib import Path

import keras
import numpy as np

import keras_transformers as kt
from keras_transformers import models as m

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_saved_presets_load import _inputs  # noqa: E402

SMALL = dict(
    vocabulary_size=32,
    num_layers=2,
    hidden_dim=16,
    num_heads=2,
    intermediate_dim=24,
    max_sequence_length=16,
)
LLAMA = dict(
    norm_type="rms",
    position_embedding="rotary",
    activation="silu",
    gated_feed_forward=True,
    use_bias=False,
)
CASES = {
    "gpt2": (m.GPTCausalLM, {}),
    "llama_sliding": (
        m.GPTCausalLM,
        dict(LLAMA, num_kv_heads=1, sliding_window=3, tie_embeddings=False),
    ),
    "bert": (
        m.BertMaskedLM,
        dict(
            stacks="encoder",
            norm_position="post",
            final_norm=False,
            embedding_norm=True,
            num_segments=2,
        ),
    ),
    "seq2seq": (
        m.Seq2SeqLM,
        dict(
            stacks="encoder_decoder",
            position_embedding="sinusoidal",
            scale_embeddings=True,
        ),
    ),
    "mixtral": (
        m.MixtralCausalLM,
        dict(LLAMA, moe=kt.config.MoEConfig(num_experts=3, num_experts_per_token=2)),
    ),
    "vit": (
        m.ViTClassifier,
        dict(
            vocabulary_size=0,
            stacks="encoder",
            vision=kt.config.VisionConfig(image_size=8, patch_size=4, num_channels=3),
        ),
    ),
}


def main(out: Path) -> None:
    keras.utils.set_random_seed(7)
    outputs = {}
    for name, (cls, fields) in CASES.items():
        config = kt.TransformerConfig(**{**SMALL, **fields})
        task = {"num_classes": 3} if cls is m.ViTClassifier else {}
        model = cls(config=config, **task)
        result = model(_inputs(name))
        result = result if not isinstance(result, dict) else result[sorted(result)[0]]
        outputs[name] = keras.ops.convert_to_numpy(result)
        model.save_to_preset(out / name)
    np.savez(out / "outputs.npz", **outputs)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
