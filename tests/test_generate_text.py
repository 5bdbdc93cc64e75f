"""Text in, text out: greedy generation from a real checkpoint (SmolLM2)
equals `transformers`' token for token; repetition_penalty, min_new_tokens
and generation_config.json defaults equal `transformers`' on a tiny random
Llama; stop strings; the generation config survives save -> load."""

import json

import numpy as np
import pytest
from toy_tokenizer import ToyTokenizer

import keras_transformers
from keras_transformers.generation import GenerationConfig
from keras_transformers.generation.config import resolve_sampler
from keras_transformers.generation.sampling import SamplerSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TIE = 1e-4  # a top-2 score gap below this is a near-tie: compare no further
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at",
]


def reference(hf, ids, max_new_tokens, **kwargs):
    """transformers' greedy tokens for `ids` and how many of them are safe
    to compare (up to the first step whose top-2 scores nearly tie)."""
    out = hf.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    for step, scores in enumerate(out.scores):
        top = torch.topk(scores[0].float(), 2).values
        if float(top[0] - top[1]) < TIE:
            return tokens, step
    return tokens, len(tokens)


def assert_same(ours, theirs, safe, at_least=4):
    assert safe >= at_least, f"near-tie at step {safe}: pick another prompt"
    assert list(ours[:safe]) == theirs[:safe]


# -- SmolLM2-135M-Instruct ----------------------------------------------------


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return keras_transformers.from_preset(str(smollm2_dir))


@pytest.fixture(scope="module")
def hf_smol(smollm2_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_dir, dtype=torch.float32
    ).eval()
    return model, transformers.AutoTokenizer.from_pretrained(smollm2_dir)


def test_smollm2_greedy_equals_transformers(smol, hf_smol):
    hf, tokenizer = hf_smol
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert smol.generation_config.eos_token_id == (2,)
    out = smol.generate(rows, max_new_tokens=12)  # one batch, prompts of 3 lengths
    texts = smol.generate(PROMPTS, max_new_tokens=12)  # the same program, text in
    for row, ids, text in zip(out, rows, texts):
        theirs, safe = reference(hf, ids, 12)
        assert_same(row[len(ids) :], theirs, safe)
        if safe == len(theirs):
            assert text == tokenizer.decode(ids + theirs)


def _chat_ids(tokenizer):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    ids = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return messages, list(ids["input_ids"] if isinstance(ids, dict) else ids)


def test_smollm2_chat_equals_transformers(smol, hf_smol, smollm2_dir):
    hf, tokenizer = hf_smol
    template = (smollm2_dir / "chat_template.jinja").read_text()
    messages, ids = _chat_ids(tokenizer)
    theirs, safe = reference(hf, ids, 24)
    assert safe == len(theirs) and theirs[-1] == 2  # the reply ends with <|im_end|>
    reply = smol.chat(messages, max_new_tokens=24, chat_template=template)
    assert reply == tokenizer.decode(theirs[:-1])
    if getattr(smol.tokenizer, "chat_template", None):  # the checkpoint's own
        assert smol.chat(messages, max_new_tokens=24) == reply


# Real weights' logits under the processors: once (a 30-layer program of its
# own); the processors on every backend: the tiny Llama's tests below.
@pytest.mark.once
def test_smollm2_processors_equal_transformers(smol, hf_smol):
    """Repetition penalty and a minimum length that outlasts the chat reply."""
    hf, tokenizer = hf_smol
    _, ids = _chat_ids(tokenizer)
    reply, _ = reference(hf, ids, 24)
    options = dict(repetition_penalty=1.3, min_new_tokens=len(reply) + 2)
    theirs, safe = reference(hf, ids, len(reply) + 4, **options)
    ours = smol.generate([ids], max_new_tokens=len(theirs), **options)[0]
    assert_same(ours[len(ids) :], theirs, safe)
    assert 2 not in ours[len(ids) : len(ids) + options["min_new_tokens"]].tolist()


# -- a tiny random Llama with a generation_config.json -------------------------

LLAMA = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,  # the processors' logic: each setting compiles a loop
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
PROMPT = [1, 10, 20, 30, 11]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(our model, transformers model, directory); the generation config
    sets two end tokens, a repetition penalty and the lengths."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.5)
    directory = tmp_path_factory.mktemp("tiny_llama")
    hf.save_pretrained(directory)
    free = hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=12)
    free = free[0, len(PROMPT) :].tolist()
    # The first token of a free run from the 3rd on that is new there ends a row.
    at = next(i for i in range(2, 12) if free[i] not in free[:i] + PROMPT)
    generation = {
        "eos_token_id": [free[at], 63],
        "repetition_penalty": 1.5,
        "min_new_tokens": 2,
        "max_new_tokens": 9,
        "bos_token_id": 1,
        "pad_token_id": 0,
    }
    (directory / "generation_config.json").write_text(json.dumps(generation))
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    lm = keras_transformers.from_preset(str(directory))
    lm.tokenizer = ToyTokenizer(64)
    lm.stops_after = at + 1  # tokens generated before stopping, without a penalty
    return lm, hf, directory


def test_generation_config_is_read(tiny):
    lm, _, _ = tiny
    assert lm.generation_config.eos_token_id[1] == 63
    assert lm.generation_config.repetition_penalty == 1.5
    assert lm.generation_config.max_new_tokens == 9


def test_defaults_and_overrides_equal_transformers(tiny):
    lm, hf, _ = tiny
    for options in ({}, {"repetition_penalty": 1.0}):
        count = 9 if not options else 6
        theirs, safe = reference(hf, PROMPT, count, **options)
        ours = lm.generate(
            [PROMPT], **options, **({"max_new_tokens": 6} if options else {})
        )[0]
        assert_same(ours[len(PROMPT) :], theirs, safe, at_least=3)
        if safe == len(theirs):
            assert len(ours) == len(PROMPT) + len(theirs)


def test_min_new_tokens_equals_transformers(tiny):
    lm, hf, _ = tiny
    end = lm.generation_config.eos_token_id[0]
    options = dict(repetition_penalty=1.0, max_new_tokens=8)
    stopped = lm.generate([PROMPT], min_new_tokens=0, **options)[0]
    assert stopped[-1] == end and len(stopped) == len(PROMPT) + lm.stops_after
    least = lm.stops_after + 2
    theirs, safe = reference(
        hf, PROMPT, 8, min_new_tokens=least, repetition_penalty=1.0
    )
    ours = lm.generate([PROMPT], min_new_tokens=least, **options)[0]
    assert_same(ours[len(PROMPT) :], theirs, safe)
    assert end not in ours[len(PROMPT) : len(PROMPT) + least].tolist()


def test_generation_config_survives_save_and_load(tiny, tmp_path):
    lm, _, _ = tiny
    tokenizer, lm.tokenizer = lm.tokenizer, None  # the toy tokenizer has no files
    try:
        lm.save_to_preset(tmp_path / "saved")
    finally:
        lm.tokenizer = tokenizer
    again = keras_transformers.from_preset(str(tmp_path / "saved"))
    assert again.generation_config == lm.generation_config
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert saved["eos_token_id"] == list(lm.generation_config.eos_token_id)
    again.generation_config = None  # saving without one removes the file
    again.save_to_preset(tmp_path / "saved")
    assert not (tmp_path / "saved" / "generation_config.json").exists()


def test_generation_config_file_round_trip(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"eos_token_id": 7, "do_sample": True, "foo": 1}))
    config = GenerationConfig.from_json_file(path)
    assert config.eos_token_id == (7,) and config.do_sample is True
    assert config.to_dict() == {"eos_token_id": 7, "do_sample": True}
    assert GenerationConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="repetition_penalty"):
        GenerationConfig(repetition_penalty=0.0)


def test_sampler_resolution():
    none, sample = GenerationConfig(), GenerationConfig(do_sample=True, top_p=0.9)
    assert resolve_sampler(none, None, None, None, None) == SamplerSpec()
    # do_sample: the checkpoint's settings, with transformers' top_k=50.
    assert resolve_sampler(sample, None, None, None, None) == SamplerSpec(
        "top_p", 1.0, 50, 0.9
    )
    assert resolve_sampler(sample, "greedy", None, None, None) == SamplerSpec()
    assert resolve_sampler(none, None, 0.5, 3, None) == SamplerSpec("top_k", 0.5, 3)
    # top_k and top_p together: the nucleus of the top k, whichever sampler named.
    for sampler in (None, "top_k", "top_p"):
        spec = resolve_sampler(none, sampler, None, 3, 0.5)
        assert spec == SamplerSpec("top_p", 1.0, 3, 0.5), sampler
    for sampler, k, p in (("greedy", 3, None), ("random", None, 0.5)):
        with pytest.raises(ValueError, match="has no `top_k` or `top_p`"):
            resolve_sampler(sample, sampler, None, k, p)
    with pytest.raises(ValueError, match="top_p"):
        resolve_sampler(none, "top_p", None, None, 2.0)


# -- stop strings (tiny model, toy tokenizer) ------------------------------------


def _expected_stop(tokenizer, completion, stop):
    """The fewest completion tokens whose text contains `stop`."""
    for k in range(1, len(completion) + 1):
        if stop in tokenizer.decode(completion[:k]):
            return k
    return None


@pytest.mark.parametrize("at", [2, 10])  # inside the first chunk, after it
def test_stop_strings(tiny, at):
    lm, _, _ = tiny
    tok = lm.tokenizer
    options = dict(max_new_tokens=14, stop_token_ids=None, repetition_penalty=1.0)
    free = lm.generate([PROMPT], **options)[0][len(PROMPT) :].tolist()
    # A stop string that ends one character into token `at`.
    stop = tok.decode(free[at - 1 : at]) + tok.decode(free[at : at + 1])[:1]
    k = _expected_stop(tok, free, stop)
    ids = lm.generate([PROMPT], stop_strings=stop, **options)[0].tolist()
    assert ids == PROMPT + free[:k]
    streamed = []
    again = lm.generate(
        [PROMPT], stop_strings=[stop, "unlikely!"], stream=streamed.append, **options
    )
    assert again[0].tolist() == ids and [int(t[0]) for t in streamed] == free[:k]
    prompt_text = tok.decode(PROMPT)
    text = lm.generate(prompt_text, stop_strings=stop, **options)
    completion = tok.decode(free[:k])
    assert text == prompt_text + completion[: completion.find(stop) + len(stop)]
    # A batch: the other row runs to its own end.
    rows = lm.generate([PROMPT, PROMPT[:3]], stop_strings=stop, **options)
    assert rows[0].tolist()[: len(ids)] == ids and not rows[0][len(ids) :].any()
    alone = lm.generate([PROMPT[:3]], stop_strings=stop, **options)[0]
    np.testing.assert_array_equal(rows[1][: len(alone)], alone)


def test_stop_strings_need_a_tokenizer(tiny):
    lm, _, _ = tiny
    tokenizer, lm.tokenizer = lm.tokenizer, None
    try:
        with pytest.raises(ValueError, match="tokenizer"):
            lm.generate([PROMPT], stop_strings="x")
    finally:
        lm.tokenizer = tokenizer
    with pytest.raises(ValueError, match="stop_strings"):
        lm.generate([PROMPT], stop_strings=[""])


# -- seq2seq --------------------------------------------------------------------


def test_seq2seq_min_new_tokens_and_penalty():
    from keras_transformers.models import Seq2SeqLM

    lm = Seq2SeqLM.from_preset("transformer_tiny", num_layers=1)
    source = [[5, 6, 7, 2]]
    free = lm.generate(source, max_new_tokens=6, stop_token_ids=None)[0].tolist()
    stop = free[1]
    first = free.index(stop)
    assert (
        lm.generate(source, max_new_tokens=6, stop_token_ids=[stop])[0].tolist()[
            : first + 1
        ]
        == free[: first + 1]
    )
    longer = lm.generate(
        source, max_new_tokens=6, stop_token_ids=[stop], min_new_tokens=5
    )[0].tolist()
    assert stop not in longer[:5]
    penalised = lm.generate(
        source, max_new_tokens=6, stop_token_ids=None, repetition_penalty=3.0
    )[0].tolist()
    assert len(penalised) == 6
    with pytest.raises(ValueError, match="num_beams=1"):
        lm.generate(source, num_beams=2, repetition_penalty=1.2)
