r"""An ``inference.py`` as written for the SageMaker scikit-learn container: one file that trains the model (run as
a script, as a training job runs it) and loads it for serving (``model_fn``), leaving ``input_fn``, ``predict_fn`` and
``output_fn`` to the container's defaults. inference-server serves it unmodified.

Train: a logistic regression on the iris data that scikit-learn ships (nothing is downloaded), saved as
``model.joblib`` in ``--model-dir`` (a training job passes it in ``SM_MODEL_DIR``)::

    python examples/inference_script/code/inference.py --model-dir /tmp/iris-model

Serve it with the scikit-learn container's defaults for the functions it leaves out::

    inference-server serve --model-dir /tmp/iris-model \
        --script examples/inference_script/code/inference.py --script-defaults sklearn

or laid out as SageMaker unpacks a ``model.tar.gz``, the script in the model directory's ``code/``::

    mkdir -p /tmp/iris-model/code && cp examples/inference_script/code/inference.py /tmp/iris-model/code/
    SAGEMAKER_PROGRAM=inference.py inference-server serve --model-dir /tmp/iris-model --script-defaults sklearn

(The script is served alone: plugins installed in the same environment, as in this repository's ``.venv``, have no
say in it unless named with ``--plugins``.)

Ask it (CSV or JSON rows of four measurements in cm; the answer is JSON unless ``Accept`` asks for CSV or ``.npy``)::

    curl localhost:8080/invocations -H 'Content-Type: text/csv' --data-binary $'5.1,3.5,1.4,0.2\n6.7,3.0,5.2,2.3'
    ["setosa", "virginica"]

Send one row alone as JSON, ``[[5.1, 3.5, 1.4, 0.2]]``: the container's defaults read a one-line CSV body as a 1-D
array, which ``predict`` refuses (a 500, as in the container).
"""

import argparse
import os

import joblib


def model_fn(model_dir):
    """Load the model that training saved; the container's defaults run it (``model.predict``)."""
    return joblib.load(os.path.join(model_dir, "model.joblib"))


if __name__ == "__main__":
    # Training's imports: serving needs none of them (joblib.load imports what the model needs).
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    parser = argparse.ArgumentParser()
    # Hyperparameters, as a training job passes them.
    parser.add_argument("--max-iter", type=int, default=1000)
    # SageMaker's arguments: a training job sets the variable.
    parser.add_argument("--model-dir", type=str, default=os.environ.get("SM_MODEL_DIR"))
    args = parser.parse_args()
    if not args.model_dir:
        parser.error("--model-dir (or SM_MODEL_DIR) is required")

    iris = load_iris()
    model = LogisticRegression(max_iter=args.max_iter).fit(iris.data, iris.target_names[iris.target])
    os.makedirs(args.model_dir, exist_ok=True)
    joblib.dump(model, os.path.join(args.model_dir, "model.joblib"))
    print(os.path.join(args.model_dir, "model.joblib"))
