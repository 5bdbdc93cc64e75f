"""Every bad input of the catalogue (`bad_inputs.CASES`: configs, model
inputs, `generate()` arguments, every family) raises a ValueError or
TypeError from this library whose message names the problem; the
reliability page lists each case."""

import re
from pathlib import Path

import pytest
from bad_inputs import CASES, assert_ours, build_models

DOC = Path(__file__).parents[1] / "docs" / "reliability.md"


@pytest.fixture(scope="module")
def models():
    return build_models()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_a_library_error(models, case):
    _, _, make, match = case
    with pytest.raises((ValueError, TypeError)) as info:
        make(models)
    assert_ours(info.value)
    assert re.search(match, str(info.value)), str(info.value)


def test_catalogue_is_distinct_and_documented():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) >= 60
    text = DOC.read_text()
    listed = re.findall(r"^\| (\d+) \| `([a-z0-9_]+)` \|", text, re.MULTILINE)
    assert [name for _, name in listed] == ids
    assert [int(n) for n, _ in listed] == list(range(1, len(ids) + 1))
