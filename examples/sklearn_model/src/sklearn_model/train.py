"""Train the example model: ``python -m sklearn_model.train MODEL_DIR`` saves a logistic regression fitted on the iris
data (which scikit-learn ships: nothing is downloaded) as ``MODEL_DIR/model.joblib``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from sklearn_model import MODEL_FILE


def train(model_dir: str | os.PathLike[str]) -> Path:
    """Fit the model on the iris data and save it in ``model_dir`` (made if missing); return the file's path."""
    features, species = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=1000).fit(features, species)
    path = Path(model_dir) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sklearn_model.train", description=__doc__.split(":")[0])
    parser.add_argument("model_dir", help="where to save model.joblib (the directory to serve)")
    print(train(parser.parse_args(argv).model_dir))


if __name__ == "__main__":
    main()
