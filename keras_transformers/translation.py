"""Deprecated: parallel text lives in `keras_transformers.data.parallel`."""

from keras_transformers._deprecated import moved_to

__getattr__ = moved_to(__name__, "keras_transformers.data.parallel")
