"""The one configuration schema shared by every family.

The package: `schema` (`TransformerConfig`), `groups` (its option groups:
`MoEConfig`, `VisionConfig`, `DisentangledConfig`,
`LinearAttentionConfig`), `layer_types` (per-layer
types and settings), `validation` (the checks and their messages),
`serialization` (dicts both ways) and `param_count` (closed-form counts).

A family is a set of values for :class:`TransformerConfig`, not a new class.
Every field is documented once, here; models derive their `get_config()` from
this object, so nothing can drift.

Glossary (ours -> paper / Hugging Face):

=====================  ==========================================================
``vocabulary_size``     vocab_size
``num_layers``          N / num_hidden_layers / n_layer (encoder stack for seq2seq)
``num_decoder_layers``  decoder_layers (seq2seq only)
``hidden_dim``          d_model / hidden_size / n_embd
``num_heads``           h / num_attention_heads / n_head
``num_kv_heads``        num_key_value_heads (GQA); None means MHA
``head_dim``            d_k = d_v / head_dim
``intermediate_dim``    d_ff / intermediate_size / n_inner
``max_sequence_length`` max_position_embeddings / n_positions
``dropout``             P_drop / hidden_dropout_prob / resid_pdrop
``attention_dropout``   attention_probs_dropout_prob / attn_pdrop
``norm_epsilon``        layer_norm_eps / rms_norm_eps / layer_norm_epsilon
``rope_max_wavelength`` rope_theta
``sliding_window``      sliding_window (Mistral / Mixtral; Gemma 2/3: the sliding layers')
``layer_types``         layer_types (Gemma 2/3, Qwen3, gpt-oss)
``layer_settings``      per type: rope_local_base_freq (Gemma 3), ...
``attention_softcap``   attn_logit_softcapping (Gemma 2)
``logit_softcap``       final_logit_softcapping (Gemma 2)
``norm_position="sandwich"`` pre_feedforward_layernorm / post_*_layernorm (Gemma 2/3)
``qkv_bias``            Qwen2's q_proj / k_proj / v_proj biases
``qk_norm``             Qwen3's q_norm / k_norm
``relative_attention_*`` relative_attention_num_buckets / _max_distance (T5)
``disentangled.*``      relative_attention, position_buckets, max_relative_positions,
                        share_att_key, pos_att_type, norm_rel_ebd (DeBERTa-v2 / v3)
``pooler_activation``   pooler_hidden_act (DeBERTa's ContextPooler)
``scale_logits``        scale_decoder_outputs (T5 v1.0: d_model**-0.5, tied head)
``num_segments``        type_vocab_size (BERT)
``embedding_dim``       embedding_size (ALBERT, ELECTRA: factorised embeddings)
``num_layer_groups``    num_hidden_groups (ALBERT: blocks shared across depth)
``norm_type="layer_no_bias"`` norm_bias=False (ModernBERT)
``first_attention_norm`` False: ModernBERT's first layer's attn_norm is an identity
``token_dropout_mask_id`` mask_token_id with token_dropout=True (ESM)
``tie_embeddings``      tie_word_embeddings
``separate_decoder_positions`` BART's own decoder.embed_positions table
``moe.num_experts``     num_local_experts (Mixtral) / num_experts (Qwen-MoE)
``vision.image_size``   image_size (ViT); ``patch_size``, ``num_channels`` alike
``vision.rescale``      rescale_factor (HF image processor)
``vision.mean / std``   image_mean / image_std (HF image processor)
``vision.distillation_token`` DeiT's distillation_token
``layer_scale``         layerscale_value (DINOv2's layer_scale1 / layer_scale2)
``pooler``              ViT's pre-logits layer / HF ViTModel's pooler
``remat``               gradient_checkpointing (HF: a training argument)
``memory_length``       mem_len (Transformer-XL)
``clamp_len``           clamp_len (Transformer-XL)
``attention_output_gate`` Qwen3-Next / Qwen3.5's gate half of q_proj (attn_output_gate)
``linear_attention.*``  linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
                        linear_value_head_dim, linear_conv_kernel_dim (Qwen3-Next, Qwen3.5)
=====================  ==========================================================
"""

from keras_transformers.config.groups import (  # noqa: F401 (public names)
    ATTENTION_TERMS,
    DISPATCH_MODES,
    POOLINGS,
    DisentangledConfig,
    LinearAttentionConfig,
    MoEConfig,
    VisionConfig,
)
from keras_transformers.config.schema import TransformerConfig

__all__ = [
    "TransformerConfig",
    "MoEConfig",
    "VisionConfig",
    "DisentangledConfig",
    "LinearAttentionConfig",
]
