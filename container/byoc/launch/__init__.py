"""byoc's launch room."""
