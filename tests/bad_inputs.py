"""Tiny models of every family, a check that an error comes from this
library, and the catalogue of distinct bad inputs (configs, model inputs,
`generate()` arguments) that docs/reliability.md lists.

`assert_ours(error)`: the error is a ValueError or TypeError raised by a
`raise` statement inside keras_transformers (not by Keras, a backend,
NumPy or a Python builtin on the way), or Python's own message for a
keyword argument a function does not take.
"""

import linecache
import math
import os

import numpy as np

import keras_transformers
from keras_transformers import TransformerConfig
from keras_transformers.models import (
    BertClassifier,
    GPTBackbone,
    GPTCausalLM,
    MixtralCausalLM,
    Seq2SeqLM,
    ViTClassifier,
)

PACKAGE = os.path.dirname(keras_transformers.__file__)
VOCAB, LENGTH = 64, 32
BASE = dict(
    vocabulary_size=VOCAB,
    num_layers=1,
    hidden_dim=16,
    num_heads=2,
    intermediate_dim=32,
    max_sequence_length=LENGTH,
    bos_token_id=1,
    eos_token_id=2,
)
FAMILIES = {
    "gpt": dict(BASE),
    "mixtral": dict(
        BASE,
        num_kv_heads=1,
        norm_type="rms",
        position_embedding="rotary",
        moe=dict(num_experts=2, num_experts_per_token=1),
    ),
    "bert": dict(BASE, stacks="encoder", norm_position="post", num_segments=2),
    "seq2seq": dict(BASE, stacks="encoder_decoder", position_embedding="sinusoidal"),
    "vit": dict(
        BASE,
        vocabulary_size=0,
        bos_token_id=None,
        eos_token_id=None,
        stacks="encoder",
        vision=dict(image_size=8, patch_size=4),
    ),
}


def build_models():
    """One tiny model per family: name -> model."""
    return {
        "gpt": GPTCausalLM(config=FAMILIES["gpt"]),
        "mixtral": MixtralCausalLM(config=FAMILIES["mixtral"]),
        "bert": BertClassifier(config=FAMILIES["bert"], num_classes=3),
        "seq2seq": Seq2SeqLM(config=FAMILIES["seq2seq"]),
        "vit": ViTClassifier(config=FAMILIES["vit"], num_classes=3),
    }


SIGNATURE_ERRORS = ("unexpected keyword argument",)


def assert_ours(error: BaseException) -> None:
    """Asserts that `error` is a ValueError / TypeError raised by a `raise`
    statement of keras_transformers (its innermost frame)."""
    assert isinstance(error, (ValueError, TypeError)), repr(error)
    if isinstance(error, TypeError) and any(s in str(error) for s in SIGNATURE_ERRORS):
        return
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    file, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
    source = linecache.getline(file, line).strip()
    where = f"{file}:{line}: {source}"
    assert file.startswith(PACKAGE), f"raised outside the library: {where}\n{error}"
    assert source.startswith("raise"), f"not a library message: {where}\n{error}"


def _config(**changes):
    return lambda m: TransformerConfig.from_dict({**BASE, **changes})


def _group(family, group, **changes):
    config = dict(FAMILIES[family])
    config[group] = {**config[group], **changes}
    return lambda m: TransformerConfig.from_dict(config)


def _call(family, inputs):
    return lambda m: m[family](inputs)


def _generate(family="gpt", prompts=((3, 4, 5),), **kwargs):
    prompts = [list(p) for p in prompts] if isinstance(prompts, tuple) else prompts
    kwargs.setdefault("max_new_tokens", 2)
    return lambda m: m[family].generate(prompts, **kwargs)


IDS = np.ones((2, 5), "int32")
IMAGES = np.zeros((2, 8, 8, 3), "float32")
S2S = {"encoder_token_ids": IDS, "decoder_token_ids": IDS}
NAN = math.nan

# (id, what is wrong, how to produce it, a regex the message must contain)
CASES = [
    # Configs.
    ("config_zero_vocabulary", "`vocabulary_size=0` (text model)", _config(vocabulary_size=0), "vocabulary_size"),
    ("config_negative_vocabulary", "`vocabulary_size=-5`", _config(vocabulary_size=-5), "vocabulary_size"),
    ("config_float_size", "`vocabulary_size=1.5` (not an integer)", _config(vocabulary_size=1.5), "vocabulary_size"),
    ("config_string_size", "`vocabulary_size=\"64\"` (a string)", _config(vocabulary_size="64"), "vocabulary_size"),
    ("config_zero_hidden", "`hidden_dim=0`", _config(hidden_dim=0), "hidden_dim"),
    ("config_negative_layers", "`num_layers=-1`", _config(num_layers=-1), "num_layers"),
    ("config_heads_not_dividing", "`num_heads=3` with `hidden_dim=16`", _config(num_heads=3), "num_heads"),
    ("config_kv_heads_not_dividing", "`num_kv_heads=3` with `num_heads=4`", _config(num_heads=4, num_kv_heads=3), "num_kv_heads"),
    ("config_odd_rotary_head", "odd `head_dim` with rotary positions", _config(position_embedding="rotary", head_dim=5), "head_dim"),
    ("config_none_size", "`intermediate_dim=None`", _config(intermediate_dim=None), "intermediate_dim"),
    ("config_zero_length", "`max_sequence_length=0`", _config(max_sequence_length=0), "max_sequence_length"),
    ("config_unknown_stacks", "`stacks=\"decoder_only\"` (unknown)", _config(stacks="decoder_only"), "stacks"),
    ("config_unknown_norm", "`norm_type=\"batch\"` (unknown)", _config(norm_type="batch"), "norm_type"),
    ("config_unknown_activation", "`activation=\"tanh\"` (unknown)", _config(activation="tanh"), "activation"),
    ("config_unknown_positions", "`position_embedding=\"alibi\"` (unknown)", _config(position_embedding="alibi"), "position_embedding"),
    ("config_list_for_string", "`norm_position=[\"pre\"]` (a list)", _config(norm_position=["pre"]), "norm_position"),
    ("config_dropout_one", "`dropout=1.0`", _config(dropout=1.0), "dropout"),
    ("config_dropout_nan", "`dropout=nan`", _config(dropout=NAN), "dropout"),
    ("config_negative_attention_dropout", "`attention_dropout=-0.1`", _config(attention_dropout=-0.1), "attention_dropout"),
    ("config_infinite_epsilon", "`norm_epsilon=inf`", _config(norm_epsilon=math.inf), "norm_epsilon"),
    ("config_small_rope_base", "`rope_max_wavelength=0.5`", _config(rope_max_wavelength=0.5), "rope_max_wavelength"),
    ("config_nan_initializer", "`initializer_range=nan`", _config(initializer_range=NAN), "initializer_range"),
    ("config_string_for_bool", "`use_bias=\"yes\"`", _config(use_bias="yes"), "use_bias"),
    ("config_int_for_bool", "`tie_embeddings=1`", _config(tie_embeddings=1), "tie_embeddings"),
    ("config_pad_outside_vocabulary", "`pad_token_id=64` with 64 ids", _config(pad_token_id=VOCAB), "pad_token_id"),
    ("config_negative_eos", "`eos_token_id=-1`", _config(eos_token_id=-1), "eos_token_id"),
    ("config_zero_window", "`sliding_window=0`", _config(sliding_window=0), "sliding_window"),
    ("config_unknown_key", "an unknown key (`hidden_size`)", _config(hidden_size=16), "hidden_size"),
    ("config_missing_key", "a required key left out", lambda m: TransformerConfig.from_dict({"vocabulary_size": 8}), "num_layers"),
    ("config_not_a_dict", "a list instead of a config dict", lambda m: TransformerConfig.from_dict([1, 2]), "dict"),
    ("config_moe_top_k", "`moe.num_experts_per_token` > `moe.num_experts`", _group("mixtral", "moe", num_experts_per_token=3), "num_experts_per_token"),
    ("config_moe_capacity", "`moe.capacity_factor=0`", _group("mixtral", "moe", capacity_factor=0), "capacity_factor"),
    ("config_moe_dispatch", "`moe.dispatch=\"fast\"` (unknown)", _group("mixtral", "moe", dispatch="fast"), "dispatch"),
    ("config_patch_not_dividing", "`vision.image_size` not a multiple of `patch_size`", _group("vit", "vision", image_size=10), "image_size"),
    ("config_zero_std", "`vision.std` with a zero", _group("vit", "vision", std=[0.0, 1.0, 1.0]), "std"),
    ("config_nan_mean", "`vision.mean=nan`", _group("vit", "vision", mean=NAN), "mean"),
    ("config_token_pool_without_token", "`pooling=\"token\"` without a class token", _group("vit", "vision", class_token=False), "pooling"),
    ("config_wrong_stacks_for_class", "an encoder config for `GPTBackbone`", lambda m: GPTBackbone(config=FAMILIES["bert"]), "stacks"),
    ("config_zero_classes", "`num_classes=0`", lambda m: BertClassifier(config=FAMILIES["bert"], num_classes=0), "num_classes"),
    ("config_bool_classes", "`num_classes=True`", lambda m: BertClassifier(config=FAMILIES["bert"], num_classes=True), "num_classes"),
    ("config_int_config", "`config=3`", lambda m: GPTBackbone(3), "config"),
    ("config_numpy_int", "`hidden_dim=np.int64(16)` (a NumPy integer)", _config(hidden_dim=np.int64(16)), "Python int"),
    ("config_moe_dict_to_constructor", "a dict as `moe` of `TransformerConfig(...)`", lambda m: TransformerConfig(**FAMILIES["mixtral"]), r"MoEConfig\(\*\*moe\)"),
    ("model_integer_dtype", "`dtype=\"int32\"` for a model", lambda m: GPTCausalLM(config=FAMILIES["gpt"], dtype="int32"), "float dtype"),
    # Model inputs.
    ("ids_rank_1", "token ids without a batch axis", _call("gpt", np.ones(5, "int32")), "batch, length"),
    ("ids_rank_3", "token ids of rank 3", _call("gpt", np.ones((1, 2, 3), "int32")), "batch, length"),
    ("ids_float", "float token ids", _call("gpt", IDS.astype("float32")), "integer"),
    ("ids_bool", "bool token ids", _call("bert", IDS.astype(bool)), "integer"),
    ("ids_strings", "an array of strings as ids", _call("gpt", np.array([["a", "b"]])), "numbers"),
    ("ids_text", "a text string given to a model", _call("gpt", "hello"), "text"),
    ("ids_ragged_list", "a ragged nested list of ids", _call("gpt", [[1, 2], [3]]), "ragged"),
    ("ids_vocabulary_size", "an id equal to `vocabulary_size`", _call("gpt", np.full((1, 3), VOCAB)), "outside"),
    ("ids_negative", "a negative id", _call("mixtral", np.full((1, 3), -1)), "outside"),
    ("ids_beyond_int32", "an int64 id beyond the int32 range", _call("gpt", np.full((1, 3), 2**40)), "int32"),
    ("ids_too_long", "a sequence longer than `max_sequence_length`", _call("bert", np.ones((1, LENGTH + 1), "int32")), "max_sequence_length"),
    ("ids_empty_batch", "an empty batch", _call("gpt", np.ones((0, 4), "int32")), "empty"),
    ("ids_empty_length", "sequences of length 0", _call("bert", np.ones((2, 0), "int32")), "empty"),
    ("ids_moe_empty_batch", "an empty batch for a mixture of experts", _call("mixtral", np.ones((0, 4), "int32")), "empty"),
    ("mask_shape", "a padding mask of another shape", _call("gpt", {"token_ids": IDS, "padding_mask": np.ones((2, 4))}), "padding_mask"),
    ("inputs_no_ids", "a dict without `token_ids`", _call("bert", {"padding_mask": IDS}), "token_ids"),
    ("inputs_hf_attention_mask", "Hugging Face's `attention_mask` key", _call("gpt", {"token_ids": IDS, "attention_mask": IDS}), "padding_mask"),
    ("inputs_hf_token_type_ids", "Hugging Face's `token_type_ids` key", _call("bert", {"token_ids": IDS, "token_type_ids": IDS * 0}), "segment_ids"),
    ("segments_out_of_range", "a segment id >= `num_segments`", _call("bert", {"token_ids": IDS, "segment_ids": IDS * 2}), "num_segments"),
    ("segments_shape", "segment ids of another shape", _call("bert", {"token_ids": IDS, "segment_ids": IDS[:, :3]}), "segment_ids"),
    ("seq2seq_no_decoder_ids", "seq2seq inputs without `decoder_token_ids`", _call("seq2seq", {"encoder_token_ids": IDS}), "decoder_token_ids"),
    ("seq2seq_batch_mismatch", "encoder and decoder batches of different sizes", _call("seq2seq", {**S2S, "decoder_token_ids": IDS[:1]}), "batch"),
    ("seq2seq_mask_shape", "an encoder mask of another shape", _call("seq2seq", {**S2S, "encoder_padding_mask": IDS[:, :2]}), "encoder_padding_mask"),
    ("images_no_batch", "one image without a batch axis", _call("vit", IMAGES[0]), "batch, height"),
    ("images_integer", "integer pixels", _call("vit", IMAGES.astype("uint8")), "floats"),
    ("images_channels", "2 channels for an RGB model", _call("vit", IMAGES[..., :2]), "channels"),
    ("images_size", "a size that is not a multiple of the patch size", _call("vit", np.zeros((1, 6, 6, 3), "float32")), "patch size"),
    ("images_channels_first", "channels-first images", _call("vit", np.zeros((1, 3, 8, 8), "float32")), "channels"),
    ("images_nan", "images containing NaN", _call("vit", np.full((1, 8, 8, 3), NAN, "float32")), "NaN"),
    ("images_empty", "an empty batch of images", _call("vit", IMAGES[:0]), "empty"),
    ("images_dict_key", "a dict without `images`", _call("vit", {"pixels": IMAGES}), "images"),
    # generate() arguments.
    ("generate_zero_new_tokens", "`max_new_tokens=0`", _generate(max_new_tokens=0), "max_new_tokens"),
    ("generate_negative_new_tokens", "`max_new_tokens=-3`", _generate(max_new_tokens=-3), "max_new_tokens"),
    ("generate_float_new_tokens", "`max_new_tokens=2.5`", _generate(max_new_tokens=2.5), "max_new_tokens"),
    ("generate_too_long", "prompt + `max_new_tokens` past `max_sequence_length`", _generate(max_new_tokens=LENGTH), "max_sequence_length"),
    ("generate_zero_temperature", "`temperature=0`", _generate(sampler="random", temperature=0), "temperature"),
    ("generate_nan_temperature", "`temperature=nan`", _generate(sampler="random", temperature=NAN), "temperature"),
    ("generate_infinite_temperature", "`temperature=inf`", _generate(sampler="random", temperature=math.inf), "temperature"),
    ("generate_zero_top_k", "`top_k=0`", _generate(top_k=0), "top_k"),
    ("generate_float_top_k", "`top_k=1.5`", _generate(top_k=1.5), "top_k"),
    ("generate_zero_top_p", "`top_p=0`", _generate(top_p=0), "top_p"),
    ("generate_large_top_p", "`top_p=1.5`", _generate(top_p=1.5), "top_p"),
    ("generate_unknown_sampler", "`sampler=\"beam\"` (unknown)", _generate(sampler="beam"), "sampler"),
    ("generate_int_stop_strings", "`stop_strings=5`", _generate(stop_strings=5), "stop_strings"),
    ("generate_empty_stop_string", "`stop_strings=[\"\"]`", _generate(stop_strings=[""]), "stop_strings"),
    ("generate_stop_strings_no_tokenizer", "stop strings on a model without tokenizer", _generate(stop_strings="."), "tokenizer"),
    ("generate_negative_stop_id", "`stop_token_ids=[-1]`", _generate(stop_token_ids=[-1]), "stop_token_ids"),
    ("generate_string_stop_ids", "`stop_token_ids=\"eos\"`", _generate(stop_token_ids="eos"), "stop_token_ids"),
    ("generate_stop_id_out_of_vocabulary", "`stop_token_ids=[vocabulary_size]`", _generate(stop_token_ids=[VOCAB]), "vocabulary_size"),
    ("generate_greedy_with_top_k", "`sampler=\"greedy\"` with `top_k=5`", _generate(sampler="greedy", top_k=5), "top_k"),
    ("generate_random_with_top_p", "`sampler=\"random\"` with `top_p=0.5`", _generate(sampler="random", top_p=0.5), "top_p"),
    ("generate_negative_seed", "`seed=-1`", _generate(seed=-1), "seed"),
    ("generate_zero_penalty", "`repetition_penalty=0`", _generate(repetition_penalty=0), "repetition_penalty"),
    ("generate_negative_min_tokens", "`min_new_tokens=-1`", _generate(min_new_tokens=-1), "min_new_tokens"),
    ("generate_stream_not_callable", "`stream=1` (not callable)", _generate(stream=1), "stream"),
    ("generate_unknown_argument", "an argument `generate()` does not take", _generate(beams=2), "beams"),
    ("prompts_empty_list", "an empty list of prompts", _generate(prompts=[]), "empty"),
    ("prompts_empty_row", "an empty prompt", _generate(prompts=[[]]), "empty"),
    ("prompts_out_of_vocabulary", "a prompt id >= `vocabulary_size`", _generate(prompts=[[VOCAB]]), "vocabulary_size"),
    ("prompts_float_ids", "float prompt ids", _generate(prompts=[[1.5, 2.0]]), "integer"),
    ("prompts_rank_3", "a prompt array of rank 3", _generate(prompts=np.ones((1, 1, 2), "int32")), "shape"),
    ("prompts_text_no_tokenizer", "text prompts on a model without tokenizer", _generate(prompts=["hi"]), "tokenizer"),
    ("prompts_mixed", "prompts mixing strings and id lists", _generate(prompts=[[1], "a"]), "mix"),
    ("prompts_none", "`prompts=None`", _generate(prompts=None), "prompts"),
    ("prompts_mask_shape", "a prompt dict whose mask has another shape", _generate(prompts={"token_ids": IDS, "padding_mask": IDS[:1]}), "padding_mask"),
    ("seq2seq_zero_beams", "`num_beams=0`", _generate("seq2seq", num_beams=0), "num_beams"),
    ("seq2seq_nan_length_penalty", "`length_penalty=nan`", _generate("seq2seq", num_beams=2, length_penalty=NAN), "length_penalty"),
    ("seq2seq_unknown_penalty_style", "`length_penalty_style=\"linear\"` (unknown)", _generate("seq2seq", num_beams=2, length_penalty_style="linear"), "length_penalty_style"),
    ("seq2seq_unknown_early_stopping", "`early_stopping=\"sometimes\"`", _generate("seq2seq", num_beams=2, early_stopping="sometimes"), "early_stopping"),
    ("seq2seq_start_out_of_vocabulary", "`start_token_id` >= `vocabulary_size`", _generate("seq2seq", start_token_id=VOCAB), "start_token_id"),
    ("seq2seq_sampling_with_beams", "a random sampler with `num_beams=2`", _generate("seq2seq", num_beams=2, sampler="random"), "num_beams"),
    ("seq2seq_int_return_all_beams", "`return_all_beams=1`", _generate("seq2seq", return_all_beams=1), "return_all_beams"),
    ("seq2seq_penalty_with_beams", "`repetition_penalty` with beam search", _generate("seq2seq", num_beams=2, repetition_penalty=1.2), "repetition_penalty"),
    ("seq2seq_source_too_long", "a source longer than `max_sequence_length`", _generate("seq2seq", prompts=[[3] * (LENGTH + 1)]), "max_sequence_length"),
]  # fmt: skip
