"""The subscription stream (`POST /v1/stream`, docs/api-stream.md), one concern per module:
`calls.py` the JSON calls a client sends, `endpoint.py` the route that opens a stream or
carries out a call on one, `hub.py` the server side of the open streams (their RecordIO bytes
and the hub that wakes them)."""
