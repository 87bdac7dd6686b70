"""byoc serve, the request protocol: bodies, Accept, answer shapes, request errors, parameters."""
