"""byoc serve, the backends: which runtime, ONNX Runtime (CPU, CUDA provider), torch, the loaded model."""
