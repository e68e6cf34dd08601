"""``digits``: scikit-learn's bundled 8×8 handwritten digits (1,797 samples, no download).

A fixed split, the same for every training seed: a permutation seeded by :data:`SPLIT_SEED` puts
1,437 samples (80%) in train and 360 in eval. Features are standardised per feature with the train
part's mean and standard deviation (constant features are left centred). Samples::

    input  [64] float32   standardised pixel intensities
           [1, 8, 8]      the same, as an image (for the conv nets and the ViT of the zoo)
    target []   int64     the digit, in [0, 10)
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from pipetrain.data.pair import DatasetPair, tensor_pairs

__all__ = ["CLASSES", "FEATURES", "IMAGE", "SPLIT_SEED", "TRAIN_FRACTION", "digits_pair"]

FEATURES = 64
IMAGE = (1, 8, 8)
CLASSES = 10
SPLIT_SEED = 0
TRAIN_FRACTION = 0.8


@functools.lru_cache(maxsize=2)
def digits_pair(images: bool = False) -> DatasetPair:
    """The train and eval ``TensorDataset`` s (materialised once per process); inputs ``[64]``, or
    ``[1, 8, 8]`` with ``images``."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = np.asarray(data.data, dtype=np.float64)
    y = np.asarray(data.target, dtype=np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_train = int(len(x) * TRAIN_FRACTION)
    mean, std = x[order[:n_train]].mean(axis=0), x[order[:n_train]].std(axis=0)
    x = (x - mean) / np.where(std > 0, std, 1.0)
    features = torch.from_numpy(x.astype(np.float32))
    features = features.view(-1, *IMAGE) if images else features
    labels = torch.from_numpy(y)
    train, held_out = torch.from_numpy(order[:n_train]), torch.from_numpy(order[n_train:])
    return DatasetPair(
        tensor_pairs(features[train], labels[train]), tensor_pairs(features[held_out], labels[held_out])
    )
