"""Free loopback ports for the multi-process tests."""

import contextlib
import socket


def free_ports(count):
    """`count` distinct 127.0.0.1 ports that were free a moment ago.

    All are held open together while picking, so they differ; a port can still
    be taken by another process before the caller binds it.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
