"""`python -m keras_transformers.cli ...`: the `keras-transformers` command."""

import sys

from keras_transformers.cli import main

if __name__ == "__main__":
    sys.exit(main())
