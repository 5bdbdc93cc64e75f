"""Chat templates render exactly as `transformers`' `apply_chat_template(
..., tokenize=False, add_generation_prompt=True)`, and `chat()` answers
with the reply only, streaming it on request."""

import jinja2
import pytest
from toy_tokenizer import ToyTokenizer

from keras_transformers.generation import GenerationConfig, apply_chat_template
from keras_transformers.models import GPTCausalLM

transformers = pytest.importorskip("transformers")

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}\n"
    "{% for message in loop_messages %}\n"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}\n"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}\n"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}\n{% endfor %}"
)
JSON_LAST = (
    "{%- for message in messages %}\n"
    "  {{- '<|' + message.role + '|>' }}\n"
    "  {%- if message.content is string %}{{ message.content }}"
    "{% else %}{{ message.content | tojson }}{% endif %}\n"
    "  {%- if not loop.last %}{{ '\\n' }}{% endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ '\\n<|assistant|>' + eos_token|tojson }}{% endif %}"
)
BLOCKS = (
    "{% for m in messages %}\n"
    "    {% if m.role == 'system' %}\n"
    "SYSTEM: {{ m.content }}\n"
    "    {% else %}\n"
    "{{ m.role | upper }}: {{ m.content }}\n"
    "    {% endif %}\n"
    "    {% if m.tool_calls is defined %}TOOLS{% endif %}\n"
    "{% endfor %}\n"
    "{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% if m.role != 'user' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% if ns.n > 1 %}{% break %}{% endif %}{% endfor %}"
    "users>={{ ns.n }} year={{ strftime_now('%Y') }}\n"
    "{% if add_generation_prompt %}\nASSISTANT:\n{% endif %}"
)
GENERATION_BLOCK = (
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% generation %}[{{ m.content }}]{% endgeneration %}"
    "{% else %}{{ m.role }}: {{ m.content | string }}{% endif %}\n{% endfor %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Café <b>&</b> ünïcode 😀"},
        {"role": "assistant", "content": "Oui.", "tool_calls": None},
        {"role": "user", "content": {"a": "é<>", "b": [1, 2]}},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir):
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


def _theirs(tokenizer, messages, template=None):
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )


def test_smollm2_template_equals_transformers(hf_tokenizer, smollm2_dir):
    template = (smollm2_dir / "chat_template.jinja").read_text()
    for messages in CONVERSATIONS[:1] + [CONVERSATIONS[1][:3]]:
        ours = apply_chat_template(
            template, messages, **hf_tokenizer.special_tokens_map
        )
        assert ours == _theirs(hf_tokenizer, messages)


@pytest.mark.parametrize("template", [LLAMA2, JSON_LAST, BLOCKS, GENERATION_BLOCK])
def test_templates_equal_transformers(hf_tokenizer, template):
    special = hf_tokenizer.special_tokens_map
    for messages in CONVERSATIONS:
        if template == LLAMA2 and not isinstance(messages[-1]["content"], str):
            messages = messages[:3] + [{"role": "user", "content": "Merci"}]
        ours = apply_chat_template(template, messages, **special)
        assert ours == _theirs(hf_tokenizer, messages, template)
        without = apply_chat_template(template, messages, False, **special)
        assert without == hf_tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False
        )


def test_raise_exception_and_sandbox(hf_tokenizer):
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="must alternate"):
        apply_chat_template(LLAMA2, bad, bos_token="<s>", eos_token="</s>")
    with pytest.raises(jinja2.exceptions.TemplateError, match="must alternate"):
        _theirs(hf_tokenizer, bad, LLAMA2)
    with pytest.raises(jinja2.exceptions.SecurityError):
        apply_chat_template("{{ messages.__class__.__mro__ }}", bad)
    with pytest.raises(jinja2.exceptions.SecurityError):
        apply_chat_template("{{ messages.append(1) }}", bad)  # immutable


# -- chat() on a tiny model ----------------------------------------------------

TEMPLATE = (
    "{% for m in messages %}{{ '<|user|>' if m.role == 'user' else '<|assistant|>' }}"
    "{{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def lm():
    # One layer: chat() is logic around generate(); each of its settings
    # compiles a decoding loop on JAX and TensorFlow.
    model = GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1)
    model.tokenizer = ToyTokenizer(512, chat_template=TEMPLATE)
    return model


def test_chat_returns_the_reply_and_streams(lm, capsys):
    messages = [{"role": "user", "content": "hi, how are you?"}]
    ids = lm.tokenizer.encode(apply_chat_template(TEMPLATE, messages))
    free = lm.generate([ids], max_new_tokens=8, stop_token_ids=None)[0][len(ids) :]
    lm.generation_config = GenerationConfig(eos_token_id=[5, int(free[2])])
    try:
        reply = lm.chat(messages, max_new_tokens=8)
        assert reply == lm.tokenizer.decode(free[:2])  # without the end token
        pieces = []
        assert lm.chat(messages, max_new_tokens=8, stream=pieces.append) == reply
        assert "".join(pieces) == reply
        assert lm.chat(messages, max_new_tokens=8, stream=True) == reply
        assert capsys.readouterr().out == reply + "\n"
        assert lm.chat("hi, how are you?", max_new_tokens=8) == reply  # one string
        # The next turn fits the same 32-position buffer: the same program.
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "and?"},
        ]
        assert isinstance(lm.chat(messages, max_new_tokens=4), str)
    finally:
        lm.generation_config = None


def test_chat_errors(lm):
    template, lm.tokenizer.chat_template = lm.tokenizer.chat_template, None
    try:
        with pytest.raises(ValueError, match="no chat template.*chat_template"):
            lm.chat([{"role": "user", "content": "hi"}])
        # An explicit template works without one on the tokenizer (no stop
        # ids: the free run's compiled loop in the test above serves it).
        reply = lm.chat(
            "hi", chat_template=TEMPLATE, max_new_tokens=2, stop_token_ids=None
        )
        assert isinstance(reply, str)
    finally:
        lm.tokenizer.chat_template = template
    tokenizer, lm.tokenizer = lm.tokenizer, None
    try:
        with pytest.raises(ValueError, match="needs a tokenizer"):
            lm.chat("hi")
    finally:
        lm.tokenizer = tokenizer
    with pytest.raises(TypeError, match="dicts"):
        lm.chat(["hi"])
