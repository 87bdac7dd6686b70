"""The model side of the server: the loaded model (or models, on a multi-model endpoint), the
handlers (the defaults and a model's overrides), batching and the inference threads, and the
runtimes the default handlers load the model on (ONNX Runtime, CUDA, torch) with their batch shapes;
the request errors the handlers raise and the Accept negotiation they answer by. Nothing here knows
HTTP: byoc.serving.http turns an answer or an error into a response."""
