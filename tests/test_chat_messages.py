"""`check_messages`: the shape of a conversation is checked before a chat
template sees it, and each mistake is named with its message's index and
the fix, instead of a template error."""

import pytest
from toy_tokenizer import ToyTokenizer

from keras_transformers.generation import check_messages
from keras_transformers.models import GPTCausalLM

TEMPLATE = (
    "{% for m in messages %}{{ '<|user|>' if m.role == 'user' else '<|assistant|>' }}"
    "{{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_valid_conversations():
    assert check_messages("hi") == [{"role": "user", "content": "hi"}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Weather?", "name": "ann"},
        {"role": "assistant", "tool_calls": [{"type": "function"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
        {"role": "assistant", "content": ""},
    ]
    assert check_messages(messages) == messages  # extra keys pass through
    assert check_messages(tuple(messages)) == messages
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    original = [{"role": "user", "content": parts}]
    assert check_messages(original) == [{"role": "user", "content": "a\nb"}]
    assert original[0]["content"] is parts  # the input is left as it was


@pytest.mark.parametrize(
    "messages, error, match",
    [
        ([], ValueError, "empty"),
        ({"role": "user", "content": "hi"}, TypeError, "a string or a list"),
        (None, TypeError, "Received: NoneType"),
        (["hi"], TypeError, "Message 0 is a str, not a dict.*dicts like"),
        ([{"content": "hi"}], ValueError, "Message 0 has no 'role'. Add one of"),
        (
            [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}],
            ValueError,
            "Message 1 has role 'bot'; the role must be one of.*'assistant'",
        ),
        (
            [{"role": "user", "content": None}],
            ValueError,
            r"Message 0 has no 'content' \(or content None\). Give the content as a "
            "string, or as a list of text parts",
        ),
        ([{"role": "user"}], ValueError, "Message 0 has no 'content'"),
        (
            [{"role": "assistant", "tool_calls": []}],
            ValueError,
            "Message 0 has no 'content'",
        ),
        (
            [{"role": "user", "content": 7}],
            ValueError,
            "Message 0 has content of type int.*Received: 7",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            ValueError,
            "Message 0, content part 0 is 'image_url', not a text part: these "
            "models read text only",
        ),
        (
            [{"role": "user", "content": ["a"]}],
            ValueError,
            "Message 0, content part 0 is 'str', not a text part",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": None}]}],
            ValueError,
            "Message 0, content part 0 has no string 'text'",
        ),
    ],
)
def test_each_mistake_is_named(messages, error, match):
    with pytest.raises(error, match=match):
        check_messages(messages)


@pytest.fixture(scope="module")
def lm():
    model = GPTCausalLM.from_preset("gpt_llama_tiny", num_layers=1)
    model.tokenizer = ToyTokenizer(512, chat_template=TEMPLATE)
    return model


def test_chat_checks_messages_first(lm):
    # Before this check, these raised Jinja's bare UndefinedError.
    with pytest.raises(ValueError, match="Message 1 has no 'role'"):
        lm.chat([{"role": "user", "content": "hi"}, {"content": "and?"}])
    with pytest.raises(ValueError, match="Message 0 has no 'content'"):
        lm.chat([{"role": "user", "content": None}])
    parts = [{"type": "text", "text": "hi,"}, {"type": "text", "text": "you?"}]
    options = dict(max_new_tokens=2, sampler="greedy")
    assert lm.chat([{"role": "user", "content": parts}], **options) == lm.chat(
        [{"role": "user", "content": "hi,\nyou?"}], **options
    )
