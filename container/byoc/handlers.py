"""`byoc.handlers`, public API: the errors a handler raises to answer a 4xx with its own message
(`InputError` 400, `UnsupportedMediaType` 415, `NotAcceptable` 406, `PayloadTooLarge` 413), and
`inference_threads()`, the threads a handler may use. They live in byoc.serving.model.request_errors and
byoc.serving.model.default_handlers; this module re-exports them, the same objects, by name."""

from byoc.serving.model.default_handlers import inference_threads
from byoc.serving.model.request_errors import InputError, NotAcceptable, PayloadTooLarge, UnsupportedMediaType

__all__ = ["InputError", "NotAcceptable", "PayloadTooLarge", "UnsupportedMediaType", "inference_threads"]
