"""`byoc.handlers`: the errors a handler raises (`InputError` and its kin) and `inference_threads`, at
the path that models trained by earlier versions import them from. They live in
byoc.serving.request_errors and byoc.serving.default_handlers; this module only re-exports them."""

from byoc.serving.default_handlers import inference_threads
from byoc.serving.request_errors import InputError, NotAcceptable, PayloadTooLarge, UnsupportedMediaType

__all__ = ["InputError", "NotAcceptable", "PayloadTooLarge", "UnsupportedMediaType", "inference_threads"]
