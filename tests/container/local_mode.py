"""SageMaker Python SDK v2 local mode against the test image (run with .venv-sdk's Python).

    python local_mode.py IMAGE WORKDIR SCENARIO

SCENARIO: `train` (instance_count=1, then deploy, predict, delete_endpoint), `train2`
(instance_count=2: two containers form one data-parallel job), `script` (entry_point +
source_dir: the repo's code/train.py in script mode); WORKDIR holds data/{train,test,model}.
`deploy`: WORKDIR/model.tar.gz, an earlier job's model, deployed alone with
`sagemaker.model.Model(...).deploy` (the serving image), then predict and delete_endpoint.
Prints one JSON line with what happened; the test checks it.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

from sagemaker.deserializers import JSONDeserializer
from sagemaker.estimator import Estimator
from sagemaker.local import LocalSession
from sagemaker.model import Model
from sagemaker.predictor import Predictor
from sagemaker.serializers import JSONSerializer

ROLE = "arn:aws:iam::111111111111:role/SageMakerRole"  # local mode never assumes it
REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    image, workdir, scenario = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    session = LocalSession()
    # Its scratch folders (compose files, copies of the model and output) in the test's folder: in /tmp
    # by default, where the SDK leaves them.
    (workdir / "sdk-root").mkdir(exist_ok=True)
    session.config = {"local": {"local_code": True, "container_root": str(workdir / "sdk-root")}}
    result = (
        deploy(image, workdir / "model.tar.gz", session)
        if scenario == "deploy"
        else fit(image, workdir, scenario, session)
    )
    print("RESULT " + json.dumps(result), flush=True)


def predict(predictor: Predictor) -> list:
    try:
        return predictor.predict({"inputs": ["i love this so much", "i hate this a lot"]})
    finally:
        predictor.delete_endpoint()


def deploy(image: str, model_data: Path, session: LocalSession) -> dict:
    model = Model(
        image_uri=image,
        model_data=f"file://{model_data}",
        role=ROLE,
        predictor_cls=Predictor,
        sagemaker_session=session,
    )
    predictor = model.deploy(1, "local", serializer=JSONSerializer(), deserializer=JSONDeserializer())
    return {"predictions": predict(predictor)}


def fit(image: str, workdir: Path, scenario: str, session: LocalSession) -> dict:
    output = workdir / f"output-{scenario}"
    output.mkdir(parents=True, exist_ok=True)
    channels = {name: f"file://{workdir / 'data' / name}" for name in ("train", "test", "model")}
    hyperparameters = {
        "max_steps": 120,
        "learning_rate": 5e-3,
        "per_device_train_batch_size": 8,
        "freeze_embeddings": False,
        "freeze_layers": 0,
        "logging_steps": 20,
    }
    kwargs = {}
    if scenario == "script":
        kwargs = {"entry_point": "train.py", "source_dir": str(REPO / "code")}
    estimator = Estimator(
        image_uri=image,
        role=ROLE,
        instance_count=2 if scenario == "train2" else 1,
        instance_type="local",
        sagemaker_session=session,
        output_path=f"file://{output}",
        hyperparameters=hyperparameters,
        **kwargs,
    )
    estimator.fit(channels, logs=True)
    artifact = Path(estimator.model_data.replace("file://", ""))
    with tarfile.open(artifact) as tar:
        members = sorted(tar.getnames())
    result = {"model_data": str(artifact), "members": members}
    with tarfile.open(artifact.parent / "output.tar.gz") as tar:
        metrics = tar.extractfile("data/metrics.json") if "data/metrics.json" in tar.getnames() else None
        result["metrics"] = json.loads(metrics.read()) if metrics else None
    if scenario == "train":
        predictor = estimator.deploy(1, "local", serializer=JSONSerializer(), deserializer=JSONDeserializer())
        result["predictions"] = predict(predictor)
    return result


if __name__ == "__main__":
    main()
