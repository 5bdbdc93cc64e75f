"""Data for training: text, parallel text and images, ready for `model.fit`.

Five modules, all backend-independent (NumPy, the standard library and
`keras.utils.PyDataset` / Keras layers):

* :mod:`keras_transformers.data.text` - text sources (`default_text`,
  `kjv_text`, `read_text`, `sentiment_tweets`) and language-modelling
  batches (`lm_dataset`, `ShuffledBatches`);
* :mod:`keras_transformers.data.parallel` - sentence pairs for
  sequence-to-sequence training: the verse-aligned Bible split by book, a
  task generated in code, a shared BPE vocabulary and `seq2seq_dataset`;
  T5's span-corruption pretraining pairs (`span_corruption`, in
  :mod:`keras_transformers.data.span_corruption`);
* :mod:`keras_transformers.data.segments` - consecutive segments of long
  texts for a recurrent memory (Transformer-XL: `segment_batches`);
* :mod:`keras_transformers.data.chat_sft` - supervised fine-tuning data:
  conversations trained on their assistant turns (`conversation_example`),
  prompt / completion pairs (`completion_example`), packing (`sft_dataset`);
* :mod:`keras_transformers.data.images` - IDX files (MNIST /
  Fashion-MNIST), folders of images, resizing and augmentation for ViTs.

Every public name of the five is importable from here:

```python
from keras_transformers.data import lm_dataset, seq2seq_dataset, load_images
```
"""

from keras_transformers.data.chat_sft import (
    Example,
    SFTData,
    completion_example,
    conversation_example,
    pack_rows,
    render_conversation,
    sft_dataset,
)
from keras_transformers.data.images import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    IMAGE_EXTENSIONS,
    IMAGES_MAGIC,
    LABELS_MAGIC,
    Augmented,
    augmentation,
    labels_path,
    load_fashion_mnist,
    load_idx_pair,
    load_image_folder,
    load_images,
    read_idx,
    resize_images,
    write_idx,
)
from keras_transformers.data.parallel import (
    BIBLE_REQUIREMENT,
    DEFAULT_TEST_BOOKS,
    DEFAULT_VALIDATION_BOOKS,
    SPECIAL_TOKENS,
    TASKS,
    Seq2SeqDataset,
    VersePair,
    bible_db_path,
    clean_verse,
    is_test_number,
    load_bible_pairs,
    make_seq2seq_dataset,
    number_to_words,
    seq2seq_dataset,
    split_by_book,
    task_pairs,
    train_shared_tokenizer,
)
from keras_transformers.data.segments import SegmentBatches, segment_batches
from keras_transformers.data.span_corruption import (
    span_corruption,
    span_corruption_pairs,
)
from keras_transformers.data.text import (
    KJV_RANGE,
    SENTIMENT_LABELS,
    LMDataset,
    ShuffledBatches,
    default_text,
    kjv_text,
    lm_dataset,
    read_text,
    sentiment_tweets,
    split_tokens,
)

__all__ = [
    "Example",
    "SFTData",
    "completion_example",
    "conversation_example",
    "pack_rows",
    "render_conversation",
    "sft_dataset",
    "BIBLE_REQUIREMENT",
    "DEFAULT_TEST_BOOKS",
    "DEFAULT_VALIDATION_BOOKS",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "IMAGES_MAGIC",
    "IMAGE_EXTENSIONS",
    "KJV_RANGE",
    "LABELS_MAGIC",
    "SENTIMENT_LABELS",
    "SPECIAL_TOKENS",
    "TASKS",
    "Augmented",
    "LMDataset",
    "SegmentBatches",
    "Seq2SeqDataset",
    "ShuffledBatches",
    "VersePair",
    "augmentation",
    "bible_db_path",
    "clean_verse",
    "default_text",
    "is_test_number",
    "kjv_text",
    "labels_path",
    "lm_dataset",
    "load_bible_pairs",
    "load_fashion_mnist",
    "load_idx_pair",
    "load_image_folder",
    "load_images",
    "make_seq2seq_dataset",
    "number_to_words",
    "read_idx",
    "read_text",
    "resize_images",
    "sentiment_tweets",
    "segment_batches",
    "seq2seq_dataset",
    "span_corruption",
    "span_corruption_pairs",
    "split_by_book",
    "split_tokens",
    "task_pairs",
    "train_shared_tokenizer",
    "write_idx",
]
