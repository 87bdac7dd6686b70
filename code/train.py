"""Fine-tune a text classifier from the SageMaker training contract: the job `byoc train` runs,
step by step, for you to copy and change (a step here is one call into the `byoc` runtime).

Run it as the script of an Estimator (`entry_point="train.py"`, `source_dir=...`: byoc starts one
process per GPU or NeuronCore), inside the image (`python train.py`), or on a local /opt/ml tree
(`SAGEMAKER_BASE_DIR=...`). Resume after a spot interruption, SIGTERM checkpoints, several ranks and
hosts, sharded channels and the failure file work as in `byoc train`: the steps below do them.
"""

import sys

from byoc.logs import configure_logging
from byoc.training.entry import run_job  # reads the contract, calls main; failures -> output/failure


def main(contract, args, settings) -> dict:
    # Imported here: byoc sets the device's environment (XLA or not) first, and transformers reads it as it loads.
    from byoc.launch import distributed
    from byoc.training import job

    with job.stop_on_sigterm() as stop:  # SIGTERM: save a checkpoint, exit 143; rerun resumes
        setup = job.prepare(contract, args, settings)  # device, model source, data, tokens, shards
        model = job.load_model(setup)  # change the model here (it gets setup.label_names)
        trainer = job.make_trainer(setup, model)  # transformers.Trainer with byoc's samplers
        metrics = job.train_and_evaluate(setup, trainer, stop)  # resumes from the newest checkpoint
        metrics = job.finish(setup, trainer, metrics)  # predictions, metrics.json, /opt/ml/model
    distributed.teardown()  # ranks leave together once the model is saved
    return metrics


if __name__ == "__main__":
    configure_logging()
    sys.exit(run_job(main))
