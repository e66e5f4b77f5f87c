"""A round-robin TCP balancer for the benches, as a load balancer in front of several agent listeners stands in
production: each connection goes to the next listener in turn, bytes copied both ways.

  python bench/_balancer.py LISTEN_HOST:PORT BACKEND_HOST:PORT[,BACKEND_HOST:PORT...]
"""
import asyncio
import itertools
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen: str, backends: list[tuple[str, int]]) -> None:
    turn = itertools.cycle(backends)

    async def serve(client_reader, client_writer):
        host, port = next(turn)
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(serve, host, int(port), backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    targets = [(h, int(p)) for h, p in (b.rsplit(":", 1) for b in sys.argv[2].split(","))]
    asyncio.run(main(sys.argv[1], targets))
