"""The errors a handler raises to answer a request with an honest status instead of a 500.

A leaf module (no imports) so that the default handlers (`byoc.serving.default_pipeline`)
and the handler loader (`byoc.serving.user_code.handler_loader`, which re-exports them for users'
code) can both use them without importing each other.
"""

from __future__ import annotations


class InputError(ValueError):
    """A malformed or empty request: answered with 400 and this message."""

    status = 400


class UnsupportedMediaType(InputError):
    """The request's Content-Type is not one the handler reads: 415."""

    status = 415


class NotAcceptable(InputError):
    """The Accept type is not one the handler writes: 406."""

    status = 406


class PayloadTooLarge(InputError):
    """The request is over a size limit (its body, or its number of inputs): 413."""

    status = 413


class InvalidAnswer(Exception):
    """The handlers' answer cannot be sent (NaN or infinity in JSON): a 500 that says so, not a
    body clients cannot parse. Not the request's fault, so not an InputError."""

    status = 500


# No answer carries NaN or infinity: JSON has neither, and a client's parser fails on them.
NON_FINITE = (
    "the prediction holds NaN or infinity, which the answer cannot carry: the model produced a non-finite "
    "score (broken weights, or an overflow in half precision); see the endpoint's logs"
)
