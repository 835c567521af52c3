"""``localchat serve``'s listening socket (``serve_cmd._bind``): the connections asyncio
accepts on it have Nagle's algorithm off (``TCP_NODELAY``). With it on, a reply streamed on a
reused keep-alive connection (an OpenAI client's second request) sat in the kernel until the
client's delayed ACK (about 40 ms on Linux) and reached the client in one burst at the end
(a helper's trial measured 5,000-20,000 "tok/s" for 5-token replies through ``--endpoint``).
The check reads the option on the server's side of a real loopback connection."""

from __future__ import annotations

import asyncio
import socket

from localchat.app.server.serve_cmd import _bind


def test_accepted_connections_have_nagle_off():
    sock = _bind("127.0.0.1", 0)
    port = sock.getsockname()[1]

    async def accept_one() -> int:
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                server_side = transport.get_extra_info("socket")
                seen.set_result(server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await loop.create_server(Probe, sock=sock)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            value = await asyncio.wait_for(seen, 10)
            writer.close()
            return value
        finally:
            server.close()

    assert asyncio.run(accept_one()) != 0
