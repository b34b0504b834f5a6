"""The API's routers, one module per resource; `sasflow.api.app.routers` lists them."""
