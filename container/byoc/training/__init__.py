"""byoc's training room."""
