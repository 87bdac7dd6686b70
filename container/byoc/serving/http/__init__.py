"""The HTTP side of the server: connections and their limits, one invocation's path (body, slots,
timeout, the model's answer or its error as a response), and the multi-model routes. The model side
(byoc.serving's protocol, backends, execution and user_code, and multi_model) never imports it: it
answers with an `Answer` or raises a request error, and this side turns either into a response."""
