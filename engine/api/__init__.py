"""`sasflow api`: the HTTP face over the same operator services as the CLI (docs/api.md).

Needs the `api` extra (`pip install 'sasflow[api]'`): FastAPI, uvicorn and httpx. Nothing
outside this package imports it, so `import sasflow` and the roles never load them.
"""
