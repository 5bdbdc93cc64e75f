"""`keras_transformers.data`: one package for text, parallel text and images;
the old module paths forward to it with a `DeprecationWarning`."""

import importlib

import pytest

import keras_transformers.data as data
from keras_transformers.data import images, parallel, text


@pytest.mark.parametrize(
    "old, new, name",
    [
        ("keras_transformers.translation", parallel, "task_pairs"),
        ("keras_transformers.translation", parallel, "make_seq2seq_dataset"),
        ("keras_transformers.images", images, "read_idx"),
        ("keras_transformers.images", images, "FASHION_MNIST_CLASSES"),
    ],
)
def test_old_module_warns_and_returns_the_same_object(old, new, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=new.__name__):
        value = getattr(module, name)
    assert value is getattr(new, name)


def test_from_import_through_an_old_module_warns():
    with pytest.warns(DeprecationWarning, match="keras_transformers.data.parallel"):
        from keras_transformers.translation import Seq2SeqDataset
    assert Seq2SeqDataset is parallel.Seq2SeqDataset


def test_old_module_has_no_unknown_names():
    module = importlib.import_module("keras_transformers.images")
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_package_exports_the_public_names_of_its_modules():
    for module in (text, parallel, images):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and getattr(value, "__module__", module.__name__) == module.__name__
            and not isinstance(value, type(importlib))
        }
        missing = public - set(data.__all__) - {"annotations"}
        assert not missing, (module.__name__, missing)
    assert all(hasattr(data, name) for name in data.__all__)


def test_seq2seq_dataset_keeps_its_older_name():
    assert data.make_seq2seq_dataset is data.seq2seq_dataset
