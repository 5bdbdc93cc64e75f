"""`keras_transformers.data`: one package for text, parallel text and images."""

import importlib

import keras_transformers.data as data
from keras_transformers.data import images, parallel, text


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
