"""The HTTP side of the server: connections and their limits, content negotiation, one
invocation's path (body, slots, timeout, error answers), the errors a request causes, and the
multi-model routes."""
