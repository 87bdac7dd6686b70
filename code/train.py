"""Fine-tune a text classifier from the SageMaker training contract: the job `byoc train` runs.

Copy this script and change what you need; each step is one call into the `byoc` runtime.
Run it inside the image (`python train.py`) or point SAGEMAKER_BASE_DIR at a local /opt/ml tree.
"""

import logging
import sys

from byoc import distributed
from byoc.arguments import parse_hyperparameters
from byoc.cli import failure_message
from byoc.contract import read_training_contract, write_failure
from byoc.data import DataSpec, load_task_data
from byoc.handlers import default_code_dir
from byoc.logs import configure_logging
from byoc.train import (build_trainer, cache_dir_for, load_model, load_tokenizer,
                        publish_model, resolve_model, tokenize_splits)

logger = logging.getLogger("train")


def main() -> None:
    contract = read_training_contract()                          # /opt/ml/input/config/*.json
    args = parse_hyperparameters(contract.hyperparameters)       # any SDK's encoding
    distributed.setup()                                          # one rank of several, under the launcher
    cache_dir = cache_dir_for()
    with distributed.host_leader_first():                        # one rank per host fills the caches
        source = resolve_model(args, contract, cache_dir)        # model channel, path or Hub id
        data = load_task_data(contract.channel_dirs, DataSpec(   # train / eval / test splits
            text_column=args.text_column, text_pair_column=args.text_pair_column,
            label_column=args.label_column, validation_split=args.validation_split, seed=args.seed,
            max_train_samples=args.max_train_samples, max_eval_samples=args.max_eval_samples,
        ), cache_dir)
        tokenizer = load_tokenizer(source, args)
        tokenized = tokenize_splits(data, tokenizer, args, cache_dir)
    model = load_model(source, args, data.label_names)

    trainer = build_trainer(model, tokenizer, tokenized, args, contract, len(data.label_names))
    trainer.train()
    if "eval" in tokenized or "test" in tokenized:
        logger.info("evaluation: %s", trainer.evaluate(tokenized.get("eval", tokenized.get("test"))))
    if trainer.is_world_process_zero():
        publish_model(trainer, tokenizer, default_code_dir(), contract.paths.model_dir)


if __name__ == "__main__":
    configure_logging()
    try:
        main()
    except Exception as err:
        logger.exception("training failed")
        write_failure(read_training_contract().paths, failure_message(err))
        sys.exit(1)
