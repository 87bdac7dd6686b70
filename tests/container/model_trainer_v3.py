"""SageMaker Python SDK v3 `ModelTrainer` in local-container mode against the test image
(run with .venv-sdk3's Python): python model_trainer_v3.py IMAGE WORKDIR

v3 has no Estimator; its local containers get no `train` argument, so the image's CMD (train) runs.
"""

import sys
from pathlib import Path

from sagemaker.core.training.configs import Compute, InputData
from sagemaker.train import ModelTrainer
from sagemaker.train.model_trainer import Mode

image, workdir = sys.argv[1], Path(sys.argv[2])
trainer = ModelTrainer(
    training_image=image,
    training_mode=Mode.LOCAL_CONTAINER,
    role="arn:aws:iam::111111111111:role/SageMakerRole",  # local mode never assumes it
    compute=Compute(instance_type="local_cpu", instance_count=1),
    hyperparameters={"max_steps": 60, "learning_rate": 5e-3, "freeze_layers": 0, "freeze_embeddings": False},
    input_data_config=[
        InputData(channel_name=c, data_source=str(workdir / "data" / c)) for c in ("train", "test", "model")
    ],
    local_container_root=str(workdir / "v3-root"),
    base_job_name="byoc-v3",
)
trainer.train()
print("V3 DONE", flush=True)
