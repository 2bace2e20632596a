"""What the client tests share besides fixtures (a module of its own name,
so that test modules never import `conftest`, which names another
directory's conftest when several test directories run in one session)."""


def url_of(server, protocol: str) -> str:
    """The URL of `server` for a protocol ("grpc" or "http")."""
    return f"grpc://{server.grpc_url}" if protocol == "grpc" else f"http://{server.http_url}"
