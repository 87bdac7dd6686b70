"""byoc serve, execution: the model server, batching, forward passes, long texts, its threads."""
