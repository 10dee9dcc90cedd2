#!/usr/bin/env python3
"""delay_proxy.py LISTEN_ADDR PORT TARGET_ADDR TARGET_PORT DELAY_S: a TCP proxy that holds
every segment back DELAY_S seconds in each direction (in order), for the multi-node tests'
slow paths (this kernel has no netem). Runs until killed. Standard library only."""
import asyncio
import sys

listen_addr, listen_port, target_addr, target_port, delay = (
    sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))


async def pipe(reader, writer):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read():
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay, data))
            if not data:
                return

    async def write():
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    await asyncio.gather(read(), write(), return_exceptions=True)


async def handle(client_reader, client_writer):
    try:
        server_reader, server_writer = await asyncio.open_connection(target_addr, target_port)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer),
                         return_exceptions=True)


async def main():
    server = await asyncio.start_server(handle, listen_addr, listen_port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
