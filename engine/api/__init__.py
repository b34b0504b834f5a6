"""The HTTP API (`sasflow api`): FastAPI routers over the service layer."""
