"""The contenders of ``bench.py``, one small class each: ``Ours`` and
``KerasHub`` (Keras models on the current ``KERAS_BACKEND``) and ``HF``
(Hugging Face transformers in eager PyTorch). Each builds its model for any
row from the row's resolved config (``_rows.py``; the KerasHub and Hugging
Face builders live in ``_others.py``), trains one step per ``train_step()``
and, for causal rows, generates greedily.

Timing is real on a GPU: every call ends by waiting for the device
(``Env.sync``: ``torch.cuda.synchronize`` for PyTorch work, a host copy of
the result for JAX and TensorFlow)."""

from __future__ import annotations

import dataclasses
import resource
import sys

import _common
import numpy as np
from _common import LEARNING_RATE, WEIGHT_DECAY, Skip, keras_loss, keras_optimizer


class Env:
    """What the contenders share: the Keras backend, torch (or None), the
    dtype ("float32" or "bfloat16") and whether a GPU computes."""

    def __init__(self, backend, torch, dtype):
        self.backend, self.torch, self.dtype = backend, torch, dtype
        self.torch_cuda = torch is not None and torch.cuda.is_available()
        self.gpu = self.torch_cuda or keras_gpu(backend)

    def sync(self, uses_torch):
        """Waits for queued PyTorch GPU work (JAX/TensorFlow results are
        copied to the host by the caller, which waits for them)."""
        if uses_torch and self.torch_cuda:
            self.torch.cuda.synchronize()

    def reset_memory(self, uses_torch):
        if uses_torch and self.torch_cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def memory(self, uses_torch):
        """`(kind, MiB)`: this contender's peak GPU memory where PyTorch
        allocates it, else the process's peak so far (JAX's peak in use on
        a GPU, the peak RSS on a CPU)."""
        if uses_torch and self.torch_cuda:
            return "cuda_max_allocated", self.torch.cuda.max_memory_allocated() / 2**20
        if self.gpu and self.backend == "jax":
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            peak = stats.get("peak_bytes_in_use")
            return "jax_peak_bytes_in_use_process", peak and peak / 2**20
        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return "peak_rss_process", rss_kib / 1024


def keras_gpu(backend):
    """Whether the Keras backend computes on a GPU."""
    if backend == "jax":
        import jax

        return jax.devices()[0].platform == "gpu"
    tf = sys.modules.get("tensorflow")
    if backend == "tensorflow" and tf is not None:
        return bool(tf.config.list_logical_devices("GPU"))
    return False  # torch: Env.torch_cuda


class Contender:
    """A model of one row, and the calls the harness times."""

    name = ""
    uses_torch = False

    def params(self) -> int:
        raise NotImplementedError

    def train_step(self):
        raise NotImplementedError

    def generate(self, prompts, new_tokens):
        """Greedy continuation, no early stop: `[B, prompt + new]` ids."""
        raise NotImplementedError

    def notes(self) -> str:
        return ""


def with_start(new_ids, start_id):
    """`[B, 1 + new]`: the start token, then the generated ids."""
    start = np.full((new_ids.shape[0], 1), start_id, new_ids.dtype)
    return np.concatenate([start, new_ids], axis=1)


# ------------------------------------------------------------------ Keras
class KerasContender(Contender):
    """A Keras model compiled with the shared AdamW and loss, no metrics;
    one step is `train_on_batch(x, y)` on inputs placed on the device once."""

    def __init__(self, model, batch, env, **compile_kwargs):
        import keras

        self.model, self.env = model, env
        self.uses_torch = env.backend == "torch"
        model.compile(optimizer=keras_optimizer(), loss=keras_loss(), **compile_kwargs)
        tensor = keras.ops.convert_to_tensor
        self.x = keras.tree.map_structure(tensor, batch.x)
        self.y = tensor(batch.y)

    def params(self):
        return sum(int(np.prod(w.shape)) for w in self.model.trainable_weights)

    def train_step(self):
        out = self.model.train_on_batch(self.x, self.y)
        self.env.sync(self.uses_torch)
        return float(np.ravel(np.asarray(out))[0])

    def notes(self):
        policy = self.model.dtype_policy.name
        return f"jit_compile={self.model.jit_compile}, dtype={policy}"


class Ours(KerasContender):
    """`keras_transformers` on the current Keras backend."""

    name = "ours"
    jit_compile = "auto"  # the backend's default

    def __init__(self, row, cfg, batch, env):
        from keras_transformers import models

        cls = {
            "causal": models.GPTCausalLM,
            "moe": models.MixtralCausalLM,
            "mlm": models.BertMaskedLM,
            "classify": models.BertClassifier,
            "seq2seq": models.Seq2SeqLM,
            "vit": models.ViTClassifier,
        }[row.kind]
        kwargs = {}
        if row.kind in ("classify", "vit"):
            kwargs = {"num_classes": row.num_classes, "classifier_dropout": 0.0}
        self.row = row
        model = cls(config=cfg, dtype=env.dtype, **kwargs)
        super().__init__(model, batch, env, jit_compile=self.jit_compile)

    def generate(self, prompts, new_tokens):
        out = self.model.generate(
            prompts, max_new_tokens=new_tokens, stop_token_ids=None
        )
        self.env.sync(self.uses_torch)
        return np.asarray(out)

    def beam(self, sources, new_tokens, num_beams, length_penalty, start_id):
        out = self.model.generate(
            sources,
            max_new_tokens=new_tokens,
            num_beams=num_beams,
            length_penalty=length_penalty,
            length_penalty_style="power",  # HF's score / length**alpha
            stop_token_ids=None,
        )
        self.env.sync(self.uses_torch)
        return with_start(np.asarray(out), start_id)  # new tokens only: add start

    def notes(self):
        moe = self.model.config.moe
        extra = f", dispatch={moe.dispatch}" if moe is not None else ""
        return super().notes() + extra


class OursDenseDispatch(Ours):
    """Ours with `moe.dispatch="dense"` (every expert on every token, as
    KerasHub's MoE block): what sparse dispatch saves. MoE rows only."""

    name = "ours_dense_dispatch"

    def __init__(self, row, cfg, batch, env):
        if cfg.moe is None:
            raise Skip("not an MoE row")
        moe = dataclasses.replace(cfg.moe, dispatch="dense")
        super().__init__(row, dataclasses.replace(cfg, moe=moe), batch, env)


class OursExplicit(Ours):
    """Ours without memory-efficient attention or the chunked loss
    (`attention_block_size=0`, `chunked_loss=False`): what they save."""

    name = "ours_explicit"

    def __init__(self, row, cfg, batch, env):
        cfg = dataclasses.replace(cfg, attention_block_size=0)
        super().__init__(row, cfg, batch, env)
        self.model.chunked_loss = False


class OursRemat(Ours):
    """Ours with each block rematerialised in training (`remat=True`: only
    block inputs kept, the block recomputed in the backward pass)."""

    name = "ours_remat"
    remat = True

    def __init__(self, row, cfg, batch, env):
        super().__init__(row, dataclasses.replace(cfg, remat=self.remat), batch, env)


class OursRematMatmuls(OursRemat):
    """Ours with `remat="matmuls"`: blocks rematerialised keeping the outputs
    of their weight products (the element-wise work is recomputed)."""

    name = "ours_remat_matmuls"
    remat = "matmuls"


class OursCompiled(Ours):
    """Ours compiled with `jit_compile=True`: `torch.compile` on PyTorch
    (eager is the Keras default there), XLA on TensorFlow (the CPU default
    is eager graph mode), the same as `ours` on JAX."""

    name = "ours_compiled"

    jit_compile = True


class KerasHub(KerasContender):
    """KerasHub's model of the same layout on the current Keras backend
    (`preprocessor=None`); skipped where keras_hub cannot import or has no
    model of the row's layout."""

    name = "kerashub"

    def __init__(self, row, cfg, batch, env):
        try:
            import keras_hub  # noqa: F401
        except Exception as e:  # e.g. no tensorflow-text on this machine
            raise Skip(f"keras_hub does not import ({type(e).__name__}: {e})") from e
        from _others import kerashub_model

        model, compile_kwargs = kerashub_model(row, cfg, env.dtype)
        self.row = row
        super().__init__(model, batch, env, **compile_kwargs)

    def generate(self, prompts, new_tokens):
        from _common import kerashub_generate

        out = kerashub_generate(self.model, prompts, new_tokens)
        self.env.sync(self.uses_torch)
        return out

    def beam(self, sources, new_tokens, num_beams, length_penalty, start_id):
        # Compiled with `BeamSampler(num_beams)` (no length penalty there; with
        # every beam of one length it changes no work). Without a preprocessor
        # KerasHub fills the masked slots of the decoder buffer after the start.
        b = sources.shape[0]
        decoder_ids = np.zeros((b, 1 + new_tokens), "int32")
        decoder_ids[:, 0] = start_id
        decoder_mask = np.zeros((b, 1 + new_tokens), bool)
        decoder_mask[:, 0] = True
        out = self.model.generate(
            {
                "encoder_token_ids": sources,
                "encoder_padding_mask": np.ones(sources.shape, bool),
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": decoder_mask,
            },
            stop_token_ids=None,
        )
        self.env.sync(self.uses_torch)
        return np.asarray(out["decoder_token_ids"])


# ------------------------------------------------------------------ HF
class HF(Contender):
    """Hugging Face transformers in eager PyTorch (sdpa attention), on CUDA
    when PyTorch sees a GPU; bfloat16 is `model.to(torch.bfloat16)`. A step
    is forward with labels, backward and a `torch.optim.AdamW` step with the
    Keras contenders' learning rate and weight decay (PyTorch's default
    implementation, a per-tensor loop on a CPU; `--hf-fused-adamw`: fused)."""

    name = "hf"
    uses_torch = True

    def __init__(self, row, cfg, batch, env):
        if env.torch is None:
            raise Skip("torch is not installed")
        from _others import hf_model

        torch = self.torch = env.torch
        self.env, self.row = env, row
        self.device = "cuda" if env.torch_cuda else "cpu"
        model = hf_model(row, cfg)
        dtype = torch.bfloat16 if env.dtype == "bfloat16" else torch.float32
        self.model = model.to(device=self.device, dtype=dtype)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=LEARNING_RATE,
            weight_decay=WEIGHT_DECAY,
            fused=_common._HF_FUSED_ADAMW[0] or None,  # None: PyTorch's default
        )
        self.inputs = {k: self.tensor(v, dtype) for k, v in batch.hf.items()}
        if row.kind == "moe":  # the router's load-balancing loss, as ours
            self.inputs["output_router_logits"] = True
        self.forward = self.model  # the training forward (see HFCompiled)

    def tensor(self, a, float_dtype):
        a = np.asarray(a)
        dtype = float_dtype if a.dtype.kind == "f" else self.torch.long
        return self.torch.as_tensor(a, device=self.device).to(dtype)

    def params(self):
        # Tied weights once; frozen tables (Marian's sinusoids) left out.
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def train_step(self):
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward(**self.inputs).loss
        loss.backward()
        self.optimizer.step()
        return float(loss.detach().float())  # a host copy: waits for the GPU

    def generate(self, prompts, new_tokens):
        torch = self.torch
        self.model.eval()
        ids = torch.as_tensor(np.asarray(prompts), device=self.device).long()
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # end id masked: no early stop
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
        return out.cpu().numpy()

    def beam(self, sources, new_tokens, num_beams, length_penalty, start_id):
        torch = self.torch
        self.model.eval()
        ids = torch.as_tensor(np.asarray(sources), device=self.device).long()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                num_beams=num_beams,
                length_penalty=length_penalty,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # end id masked: no early stop
                do_sample=False,
                use_cache=True,
            )
        return out.cpu().numpy()

    def notes(self):
        attn = self.model.config._attn_implementation
        return f"attn={attn}, dtype={self.env.dtype}, device={self.device}, " + (
            f"threads={self.torch.get_num_threads()}"
        )


class HFCompiled(HF):
    """Hugging Face with its training forward through `torch.compile` (the
    default inductor backend); generation stays eager."""

    name = "hf_compiled"

    def __init__(self, row, cfg, batch, env):
        super().__init__(row, cfg, batch, env)
        self.forward = self.torch.compile(self.model)

    def notes(self):
        return super().notes() + ", torch.compile (training)"


CONTENDERS = {
    c.name: c
    for c in (
        Ours,
        OursCompiled,
        OursExplicit,
        OursRemat,
        OursRematMatmuls,
        OursDenseDispatch,
        KerasHub,
        HF,
        HFCompiled,
    )
}
