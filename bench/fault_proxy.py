#!/usr/bin/env python3
"""A TCP relay on 127.0.0.1 that breaks some of the connections it relays, the way networks and load
balancers do, to see what a reader of object storage does then (issue 33).

    python3 bench/fault_proxy.py --listen 9520 --to 9510 --fault stall --every 5 --after 200000
    AWS_ENDPOINT_URL=http://127.0.0.1:9520 brand read s3://bkt/ds --epochs 2 --json

Every `--every`-th connection accepted (the first counts as 1; `--offset` shifts which) gets the
fault; the others are relayed untouched, both ways:

    rst        reset (an RST) once --after bytes went from the server to the client
    fin        closed cleanly (FIN) at the same point: a body cut short
    stall      the server's bytes stop at that point, the connection stays open: silence
    refuse     reset as soon as it is accepted, before an answer
    blackhole  accepted and read, never connected on or answered

Faults act on connections, not requests: a client that keeps connections alive meets a fault in
whichever request the byte count falls. Prints `ready` once it listens and, every 5 s on stderr,
the connections relayed and faulted; runs until killed. Used for the figures in docs/DESIGN.md §4
(a body gone silent, a request never answered, SIGPIPE on a reset upload).
"""

import argparse
import asyncio
import socket
import struct
import sys


def reset(writer: asyncio.StreamWriter) -> None:
    """Closes with an RST: SO_LINGER 0, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class Proxy:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.accepted = 0
        self.faulted = 0

    async def pipe(self, reader, writer, limit=None, at_limit=None) -> None:
        sent = 0
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if limit is not None and sent + len(data) >= limit:
                    writer.write(data[: max(0, limit - sent)])
                    await writer.drain()
                    await at_limit()
                    return
                writer.write(data)
                await writer.drain()
                sent += len(data)
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    async def handle(self, client_r, client_w) -> None:
        a = self.args
        self.accepted += 1
        fault = a.fault if (self.accepted - 1 + a.offset) % a.every == 0 else None
        if fault:
            self.faulted += 1
        if fault == "refuse":
            reset(client_w)
            return
        if fault == "blackhole":
            try:
                while await client_r.read(65536):
                    pass
            except OSError:
                pass
            return
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", a.to)
        except OSError:
            reset(client_w)
            return

        async def at_limit():
            if fault == "rst":
                reset(client_w)
                server_w.close()
            elif fault == "fin":
                client_w.close()
                server_w.close()
            elif fault == "stall":
                await asyncio.sleep(1e9)

        limit = a.after if fault in ("rst", "fin", "stall") else None
        await asyncio.gather(self.pipe(client_r, server_w), self.pipe(server_r, client_w, limit, at_limit))
        client_w.close()
        server_w.close()

    async def report(self) -> None:
        while True:
            await asyncio.sleep(5)
            print(f"connections {self.accepted}, faulted {self.faulted}", file=sys.stderr, flush=True)

    async def run(self) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", self.args.listen)
        print("ready", flush=True)
        asyncio.get_running_loop().create_task(self.report())
        async with server:
            await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    ap.add_argument("--to", type=int, required=True, help="the server's port on 127.0.0.1")
    ap.add_argument("--fault", choices=["none", "rst", "fin", "stall", "refuse", "blackhole"], default="none")
    ap.add_argument("--every", type=int, default=1, help="every N-th connection gets the fault (≥ 1)")
    ap.add_argument("--offset", type=int, default=0, help="shifts which connections do")
    ap.add_argument("--after", type=int, default=0, help="rst/fin/stall: server bytes relayed first")
    args = ap.parse_args()
    if args.every < 1:
        ap.error("--every must be at least 1")
    if args.fault == "none":
        args.fault = None
    try:
        asyncio.run(Proxy(args).run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
