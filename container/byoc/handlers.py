"""`byoc.handlers`, public API: the errors a handler raises to answer a 4xx with its own message
(`InputError` 400, `UnsupportedMediaType` 415, `NotAcceptable` 406, `PayloadTooLarge` 413), and
`inference_threads()`, the threads a handler may use. They live in byoc.serving.protocol.request_errors and
byoc.serving.default_pipeline; this module re-exports them, the same objects, by name."""

from byoc.serving.default_pipeline import inference_threads
from byoc.serving.protocol.request_errors import InputError, NotAcceptable, PayloadTooLarge, UnsupportedMediaType

__all__ = ["InputError", "NotAcceptable", "PayloadTooLarge", "UnsupportedMediaType", "inference_threads"]
