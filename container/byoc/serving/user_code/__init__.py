"""byoc serve, user code: the handler contract, models' own code, the default handlers."""
