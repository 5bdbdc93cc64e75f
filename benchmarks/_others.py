"""KerasHub and Hugging Face models of a ``bench.py`` row, translated from
our resolved config (``_rows.Row.config()``): the same widths, depths,
heads, vocabulary, norms and epsilon, dropout 0. Layout differences that a
library fixes by design are listed in ``benchmarks/README.md``."""

from __future__ import annotations


def head_dim(cfg):
    return cfg.head_dim or cfg.hidden_dim // cfg.num_heads


def rotary(cfg):
    return cfg.position_embedding == "rotary"


# ------------------------------------------------------------------ KerasHub
def kerashub_model(row, cfg, dtype):
    """`(model, compile_kwargs)`: KerasHub's task model for `row`, no
    preprocessor, no metrics, greedy sampler for causal rows, `dtype` the
    Keras dtype policy."""
    import keras_hub
    from _common import Skip

    m = keras_hub.models
    d, f, n = cfg.hidden_dim, cfg.intermediate_dim, cfg.num_layers
    no_metrics = {"weighted_metrics": None, "metrics": None}
    beam = {**no_metrics, "sampler": keras_hub.samplers.BeamSampler(num_beams=4)}
    if row.kind == "causal" and not rotary(cfg):
        backbone = m.GPT2Backbone(
            dtype=dtype,
            vocabulary_size=cfg.vocabulary_size,
            num_layers=n,
            num_heads=cfg.num_heads,
            hidden_dim=d,
            intermediate_dim=f,
            dropout=0.0,
            max_sequence_length=cfg.max_sequence_length,
        )
        lm = m.GPT2CausalLM(backbone=backbone, preprocessor=None)
        return lm, {**no_metrics, "sampler": "greedy"}
    if row.kind == "causal":
        backbone = m.LlamaBackbone(
            dtype=dtype,
            vocabulary_size=cfg.vocabulary_size,
            num_layers=n,
            num_query_heads=cfg.num_heads,
            hidden_dim=d,
            intermediate_dim=f,
            num_key_value_heads=cfg.num_kv_heads or cfg.num_heads,
            rope_max_wavelength=cfg.rope_max_wavelength,
            layer_norm_epsilon=cfg.norm_epsilon,
            tie_word_embeddings=cfg.tie_embeddings,
            dropout=0,
        )
        lm = m.LlamaCausalLM(backbone=backbone, preprocessor=None)
        return lm, {**no_metrics, "sampler": "greedy"}
    if row.kind == "moe":
        backbone = m.MixtralBackbone(
            dtype=dtype,
            vocabulary_size=cfg.vocabulary_size,
            num_layers=n,
            num_query_heads=cfg.num_heads,
            hidden_dim=d,
            intermediate_dim=cfg.moe.expert_intermediate_dim or f,
            num_key_value_heads=cfg.num_kv_heads or cfg.num_heads,
            num_experts=cfg.moe.num_experts,
            top_k=cfg.moe.num_experts_per_token,
            router_aux_loss_coef=cfg.moe.router_aux_loss_coef,
            rope_max_wavelength=cfg.rope_max_wavelength,
            layer_norm_epsilon=cfg.norm_epsilon,
            sliding_window=None,  # KerasHub's default is 512
            dropout=0,
        )
        lm = m.MixtralCausalLM(backbone=backbone, preprocessor=None)
        return lm, {**no_metrics, "sampler": "greedy"}
    if row.kind in ("mlm", "classify"):
        backbone = m.BertBackbone(
            dtype=dtype,
            vocabulary_size=cfg.vocabulary_size,
            num_layers=n,
            num_heads=cfg.num_heads,
            hidden_dim=d,
            intermediate_dim=f,
            dropout=0.0,
            max_sequence_length=cfg.max_sequence_length,
            num_segments=cfg.num_segments or 2,
        )
        if row.kind == "mlm":
            return m.BertMaskedLM(backbone, preprocessor=None), no_metrics
        model = m.BertTextClassifier(
            backbone, row.num_classes, preprocessor=None, dropout=0.0
        )
        return model, no_metrics
    if row.kind == "seq2seq" and cfg.position_embedding == "relative":
        if not hasattr(m, "T5Seq2SeqLM"):
            raise Skip("this keras_hub has no T5Seq2SeqLM")
        backbone = m.T5Backbone(
            dtype=dtype,
            vocabulary_size=cfg.vocabulary_size,
            num_layers=n,
            num_heads=cfg.num_heads,
            hidden_dim=d,
            intermediate_dim=f,
            key_value_dim=head_dim(cfg),
            dropout=0.0,
            activation=cfg.activation,
            use_gated_activation=cfg.gated_feed_forward,
            layer_norm_epsilon=cfg.norm_epsilon,
            tie_embedding_weights=cfg.tie_embeddings,
        )
        return m.T5Seq2SeqLM(backbone, preprocessor=None), beam
    if row.kind == "seq2seq":  # KerasHub's encoder-decoder of this layout: BART
        backbone = m.BartBackbone(
            dtype=dtype,
            vocabulary_size=cfg.vocabulary_size,
            num_layers=n,
            num_heads=cfg.num_heads,
            hidden_dim=d,
            intermediate_dim=f,
            dropout=0.0,
            max_sequence_length=max(row.seq, row.target),
        )
        return m.BartSeq2SeqLM(backbone, preprocessor=None), beam
    if row.kind == "vit":
        v = cfg.vision
        backbone = m.ViTBackbone(
            dtype=dtype,
            image_shape=(v.image_size, v.image_size, v.num_channels),
            patch_size=v.patch_size,
            num_layers=n,
            num_heads=cfg.num_heads,
            hidden_dim=d,
            mlp_dim=f,
            dropout_rate=0.0,
            attention_dropout=0.0,
            layer_norm_epsilon=cfg.norm_epsilon,
        )
        model = m.ViTImageClassifier(
            backbone, num_classes=row.num_classes, preprocessor=None, activation=None
        )
        return model, no_metrics
    raise Skip(f"no KerasHub model for row kind {row.kind!r}")


# ------------------------------------------------------------------ HF
def hf_model(row, cfg):
    """Hugging Face's model for `row` (float32, on the CPU; `HF` moves it)."""
    import transformers as t

    d, f, n = cfg.hidden_dim, cfg.intermediate_dim, cfg.num_layers
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    rope = {"rope_type": "default", "rope_theta": cfg.rope_max_wavelength}
    if row.kind == "causal" and not rotary(cfg):
        config = t.GPT2Config(
            vocab_size=cfg.vocabulary_size,
            n_positions=cfg.max_sequence_length,
            n_embd=d,
            n_layer=n,
            n_head=cfg.num_heads,
            n_inner=f,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=cfg.norm_epsilon,
            tie_word_embeddings=cfg.tie_embeddings,
            **ids,
        )
        return t.GPT2LMHeadModel(config)
    # Llama and Mixtral share every field but the experts'.
    llama = dict(
        vocab_size=cfg.vocabulary_size,
        hidden_size=d,
        num_hidden_layers=n,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads or cfg.num_heads,
        head_dim=head_dim(cfg),
        max_position_embeddings=cfg.max_sequence_length,
        rms_norm_eps=cfg.norm_epsilon,
        rope_parameters=rope,
        attention_dropout=0.0,
        tie_word_embeddings=cfg.tie_embeddings,
        attn_implementation="sdpa",
        **ids,
    )
    if row.kind == "causal" and cfg.norm_position == "sandwich":  # Gemma 3
        from keras_transformers.convert import gemma3

        hf = {k: v for k, v in gemma3.hf_config(cfg).items() if k != "model_type"}
        config = t.Gemma3TextConfig(**hf, attn_implementation="sdpa")
        return t.Gemma3ForCausalLM(config)
    if row.kind == "causal":
        return t.LlamaForCausalLM(t.LlamaConfig(intermediate_size=f, **llama))
    if row.kind == "moe":
        config = t.MixtralConfig(
            intermediate_size=cfg.moe.expert_intermediate_dim or f,
            sliding_window=None,
            num_local_experts=cfg.moe.num_experts,
            num_experts_per_tok=cfg.moe.num_experts_per_token,
            router_aux_loss_coef=cfg.moe.router_aux_loss_coef,
            router_jitter_noise=0.0,
            **llama,
        )
        return t.MixtralForCausalLM(config)
    if row.kind in ("mlm", "classify"):
        config = t.BertConfig(
            vocab_size=cfg.vocabulary_size,
            hidden_size=d,
            num_hidden_layers=n,
            num_attention_heads=cfg.num_heads,
            intermediate_size=f,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            classifier_dropout=0.0,
            max_position_embeddings=cfg.max_sequence_length,
            type_vocab_size=cfg.num_segments or 2,
            layer_norm_eps=cfg.norm_epsilon,
            pad_token_id=0,
            tie_word_embeddings=True,
            num_labels=max(row.num_classes, 2),
        )
        if row.kind == "mlm":
            return t.BertForMaskedLM(config)  # no pooler
        return t.BertForSequenceClassification(config)
    if row.kind == "seq2seq" and cfg.position_embedding == "relative":
        config = t.T5Config(
            vocab_size=cfg.vocabulary_size,
            d_model=d,
            d_kv=head_dim(cfg),
            d_ff=f,
            num_layers=n,
            num_decoder_layers=cfg.num_decoder_layers or n,
            num_heads=cfg.num_heads,
            relative_attention_num_buckets=cfg.relative_attention_buckets,
            relative_attention_max_distance=cfg.relative_attention_max_distance,
            dropout_rate=0.0,
            layer_norm_epsilon=cfg.norm_epsilon,
            feed_forward_proj=("gated-" if cfg.gated_feed_forward else "")
            + cfg.activation,
            tie_word_embeddings=cfg.tie_embeddings,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
        return t.T5ForConditionalGeneration(config)
    if row.kind == "seq2seq":  # the 2017 layout: Marian
        config = t.MarianConfig(
            vocab_size=cfg.vocabulary_size,
            d_model=d,
            encoder_layers=n,
            decoder_layers=cfg.num_decoder_layers or n,
            encoder_attention_heads=cfg.num_heads,
            decoder_attention_heads=cfg.num_heads,
            encoder_ffn_dim=f,
            decoder_ffn_dim=f,
            max_position_embeddings=max(row.seq, row.target),
            activation_function=cfg.activation,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            scale_embedding=cfg.scale_embeddings,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=cfg.tie_embeddings,
            decoder_start_token_id=1,
            forced_eos_token_id=None,
            **ids,
        )
        return t.MarianMTModel(config)
    if row.kind == "vit":
        v = cfg.vision
        config = t.ViTConfig(
            hidden_size=d,
            num_hidden_layers=n,
            num_attention_heads=cfg.num_heads,
            intermediate_size=f,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            layer_norm_eps=cfg.norm_epsilon,
            image_size=v.image_size,
            patch_size=v.patch_size,
            num_channels=v.num_channels,
            qkv_bias=True,
            num_labels=row.num_classes,
        )
        return t.ViTForImageClassification(config)
    raise ValueError(f"no Hugging Face model for row kind {row.kind!r}")
