"""One model request's way through the router, in the order it is taken: its model named and resolved
(`targets`, forms by `multipart`), llama-swap's profiles and selectors, body filters (`filters`,
`jsonpath`), peers, then `forward` admits it at the fleet and sends it down `relay`; the
context-limit hint (`contextlimit`) and the loading messages (`loading`) are its words.

Imports `translate`, `relay`, `watch` and `door`.
"""
