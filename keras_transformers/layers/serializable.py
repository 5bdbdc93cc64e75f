"""Registration of the package's Keras objects for saving and loading."""

import keras


def serializable(cls):
    """Registers `cls` under the `keras_transformers` package name."""
    return keras.saving.register_keras_serializable(package="keras_transformers")(cls)
