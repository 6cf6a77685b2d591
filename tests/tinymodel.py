"""A tiny fastText classifier for tests, trained in a process of its own.

fastText's trainer now and then stops with ``RuntimeError: Encountered NaN`` on tiny
training files (its maintainers trace this to the learning rate; facebookresearch/fastText
#385, #638), even with one thread and a fixed seed, so the model is trained at a low
learning rate and, should it still diverge, again with the next seed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_TRAIN = ("import sys, fasttext; fasttext.train_supervised(sys.argv[1], dim=int(sys.argv[3]), "
          "bucket=int(sys.argv[4]), wordNgrams=2, thread=1, seed=int(sys.argv[5]), verbose=0, "
          "lr=0.05, epoch=int(sys.argv[6])).save_model(sys.argv[2])")


def train_tiny_model(train: Path, model: Path, *, dim: int = 8, bucket: int = 1000,
                     epoch: int = 5, tries: int = 4) -> None:
    """Train a supervised fastText model on ``train`` (``__label__X text`` lines) into
    ``model``; raises ``subprocess.CalledProcessError`` when every seed diverged."""
    for seed in range(1, tries + 1):
        done = subprocess.run([sys.executable, "-c", _TRAIN, str(train), str(model), str(dim),
                               str(bucket), str(seed), str(epoch)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode == 0 or "Encountered NaN" not in done.stderr or seed == tries:
            done.check_returncode()
            return
