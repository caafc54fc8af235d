"""What the router sees of each request: its observation (times, TTFT at the first content event,
tokens, the activity row), its capture, the in-flight list and the write timeout, the event hub
the page listens to, the request log's format, and the batch that books ended requests.

Imports only `door` (a route's dialect).
"""
