"""The training command the documentation runs: it saves a model that model_fn loads."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import sklearn_model


def test_train_command_saves_a_model_that_model_fn_loads(tmp_path: Path) -> None:
    """python -m sklearn_model.train DIR writes DIR/model.joblib (printing its path), a classifier of iris rows."""
    model_dir = tmp_path / "new" / "model"
    done = subprocess.run(
        [sys.executable, "-m", "sklearn_model.train", str(model_dir)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(model_dir / "model.joblib")
    model = sklearn_model.model_fn(str(model_dir))
    assert model.predict(np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])).tolist() == [0, 2]
