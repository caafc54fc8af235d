"""The front door: how a request is read and let in, before anyone knows which model it is for.

A connection starts in `lane` (the router's own HTTP/1.1 server for model requests on the
common path, whose request and response are `reply`'s) or, handed over, in aiohttp's server
behind `guard`'s middlewares: the Host and Origin policy (`policy`), the key (`auth`), the
body's limits. `routes` names the model routes, `dialect` which API each speaks, `responses`
the router's own error answers. The hot path starts here: a change costs every request.

Imports nothing else of the router: every room above may use it.
"""
