"""The API's routers, one module per resource; `sasflow.api.app.ROUTERS` lists them."""
