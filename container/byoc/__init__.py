"""byoc: the runtime of a SageMaker bring-your-own-container image for Hugging Face text models
(classifiers of every kind, regression, token classification).

`byoc train` fine-tunes a BERT-family classifier from the SageMaker training contract
(`/opt/ml` or `$SAGEMAKER_BASE_DIR`); `byoc serve` serves the artifact it writes.
"""

__version__ = "0.1.0"
