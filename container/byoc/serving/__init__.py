"""byoc's serving room."""
