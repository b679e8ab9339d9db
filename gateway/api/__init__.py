"""The HTTP surface: the Starlette app, its endpoints, auth, OpenAPI, the composition root and workers."""
