#!/usr/bin/env python3
"""Peak memory of the admission server under the attacks of issue 10, and whether legitimate
requests keep being answered meanwhile.

Each attack runs against a fresh `dbservice-operator webhook` process (release build), so the
peak RSS (VmHWM from /proc) belongs to that attack alone. While an attack runs, a legitimate
client sends a valid AdmissionReview every 100 ms, over a keep-alive connection opened before
the attack (as the apiserver pools its connections) and over a new connection each time.

Usage: scripts/webhook-attacks.py [--binary target/release/dbservice-operator] [--only NAME]
"""

import argparse
import logging
import multiprocessing
import asyncio
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time

VALID_REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "3a0c7e1e-0d7b-4c57-9f55-2f0b8f1d9e11",
        "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
        "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
        "operation": "CREATE",
        "object": {
            "apiVersion": "dbservice.dev/v1",
            "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user"},
        },
    },
}


def request_bytes(body, path="/validate", content_length=None, chunked=False):
    head = f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
    if chunked:
        head += "transfer-encoding: chunked\r\n\r\n"
        return head.encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    length = len(body) if content_length is None else content_length
    return head.encode() + f"content-length: {length}\r\n\r\n".encode() + body


def review_with(spec_extra=None, object_extra=None):
    review = json.loads(json.dumps(VALID_REVIEW))
    review["request"]["object"]["spec"].update(spec_extra or {})
    review["request"]["object"].update(object_extra or {})
    return json.dumps(review).encode()


class Server:
    def __init__(self, binary, certs, extra_limits=None):
        self.port = free_port()
        self.probe_port = free_port()
        command = [binary, "webhook", "--listen", f"127.0.0.1:{self.port}",
                   "--probe-listen", f"127.0.0.1:{self.probe_port}",
                   "--tls-cert", f"{certs}/tls.crt", "--tls-key", f"{certs}/tls.key"]
        preexec = None
        if extra_limits and "nofile" in extra_limits:
            nofile = extra_limits["nofile"]
            preexec = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))  # noqa: E731
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log, preexec_fn=preexec)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("the webhook server did not start")

    def status(self, field):
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def log_lines(self):
        self.log.seek(0)
        return self.log.read().count(b"\n")

    def stop(self):
        alive = self.process.poll() is None
        self.process.terminate()
        try:
            self.process.wait(timeout=25)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return alive


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tls_context(certs):
    context = ssl.create_default_context(cafile=f"{certs}/ca.crt")
    context.set_alpn_protocols(["http/1.1"])
    return context


async def open_tls(port, context):
    return await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return status


class Legitimate:
    """A valid review every 100 ms on a pooled connection and on a new connection."""

    def __init__(self, port, context):
        self.port, self.context = port, context
        self.pooled, self.fresh = [], []  # (ok, seconds)
        self.stop = asyncio.Event()

    async def run(self):
        reader, writer = await open_tls(self.port, self.context)
        body = request_bytes(json.dumps(VALID_REVIEW).encode())
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                writer.write(body)
                await writer.drain()
                ok = await asyncio.wait_for(read_response(reader), 5) == 200
            except Exception:
                ok = False
                reader, writer = await open_tls(self.port, self.context)
            self.pooled.append((ok, time.perf_counter() - started))
            started = time.perf_counter()
            try:
                fresh_reader, fresh_writer = await asyncio.wait_for(open_tls(self.port, self.context), 5)
                fresh_writer.write(body)
                await fresh_writer.drain()
                ok = await asyncio.wait_for(read_response(fresh_reader), 5) == 200
                fresh_writer.close()
            except Exception:
                ok = False
            self.fresh.append((ok, time.perf_counter() - started))
            await asyncio.sleep(0.1)

    @staticmethod
    def summary(samples):
        if not samples:
            return "-"
        ok = sum(1 for success, _ in samples if success)
        slowest = max(seconds for _, seconds in samples) * 1000
        within = sum(1 for success, seconds in samples if success and seconds <= 0.1)
        return f"{ok}/{len(samples)} ok, {within} within 100 ms, max {slowest:.0f} ms"


async def keep_sending(port, context, count, payload_for, pace, hold):
    """`count` connections, each sending its payload in pieces of `pace` (bytes, delay)."""
    async def one(index):
        try:
            reader, writer = await open_tls(port, context)
        except Exception:
            return
        payload = payload_for(index)
        size, delay = pace
        try:
            for offset in range(0, len(payload), size):
                writer.write(payload[offset:offset + size])
                await writer.drain()
                if delay:
                    await asyncio.sleep(delay)
            await asyncio.sleep(hold)
        except Exception:
            pass
        finally:
            writer.close()

    await asyncio.gather(*(one(index) for index in range(count)))


async def answered_then_trickling(port, context, count, valid, trickled):
    """`count` connections, each sending one valid review, reading its answer, then sending
    `trickled` one byte per second."""
    async def one():
        try:
            reader, writer = await open_tls(port, context)
            writer.write(valid)
            await writer.drain()
            await read_response(reader)
            for offset in range(len(trickled)):
                writer.write(trickled[offset:offset + 1])
                await writer.drain()
                await asyncio.sleep(1.0)
            writer.close()
        except Exception:
            pass

    await asyncio.gather(*(one() for _ in range(count)))


async def attack(name, port, context, certs):
    big_array = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"x":[' + b"0," * (4 * 1024 * 1024 - 1) + b"0]}}}"
    claims = review_with({"resources": {"claims": [{"name": f"c{index}"} for index in range(45000)]}})
    slow_body = request_bytes(json.dumps(VALID_REVIEW).encode())
    header_end = slow_body.index(b"\r\n\r\n") + 4
    if name == "8 MiB array, 4 at once (Content-Length)":
        await keep_sending(port, context, 4, lambda _: request_bytes(big_array), (1 << 20, 0), 1)
    elif name == "8 MiB array, 4 at once (chunked)":
        await keep_sending(port, context, 4, lambda _: request_bytes(big_array, chunked=True), (1 << 20, 0), 1)
    elif name == "~900 KiB of resources.claims, 16 at once, 10 rounds":
        for _ in range(10):
            await keep_sending(port, context, 16, lambda _: request_bytes(claims), (1 << 20, 0), 0.2)
    elif name == "declared 20 MiB Content-Length, 100 connections":
        await keep_sending(port, context, 100, lambda _: request_bytes(b"{", content_length=20 << 20), (1 << 20, 0), 5)
    elif name == "1 byte per TLS record, 50 connections x 30 KiB":
        body = review_with(object_extra={"padding": "x" * (30 * 1024)})
        await keep_sending(port, context, 50, lambda _: request_bytes(body), (1, 0), 1)
    elif name == "1000 connections sending the body at 1 byte/s":
        await keep_sending(port, context, 1000, lambda _: slow_body[:header_end] + slow_body[header_end:header_end + 15], (1, 1.0), 0)
    elif name == "1000 connections answered once, then trickling the next body at 1 byte/s":
        # Issue 37: a connection answered once used to keep its slot for good.
        await answered_then_trickling(port, context, 1000, request_bytes(json.dumps(VALID_REVIEW).encode()),
                                      slow_body[:header_end] + slow_body[header_end:header_end + 15])
    elif name == "1000 idle TLS connections":
        await keep_sending(port, context, 1000, lambda _: b"", (1, 0), 15)
    elif name == "1000 slow-header connections (1 byte/s)":
        await keep_sending(port, context, 1000, lambda _: slow_body[:15], (1, 1.0), 0)
    else:
        raise SystemExit(f"unknown attack {name}")


ATTACKS = [
    "8 MiB array, 4 at once (Content-Length)",
    "8 MiB array, 4 at once (chunked)",
    "~900 KiB of resources.claims, 16 at once, 10 rounds",
    "declared 20 MiB Content-Length, 100 connections",
    "1 byte per TLS record, 50 connections x 30 KiB",
    "1000 connections sending the body at 1 byte/s",
    "1000 connections answered once, then trickling the next body at 1 byte/s",
    "1000 idle TLS connections",
    "1000 slow-header connections (1 byte/s)",
]


def legitimate_process(port, certs, stop, results):
    """The legitimate client in its own process, so that the attacking client's CPU use cannot
    delay it (both share the machine with the server, as the apiserver would not)."""
    async def main():
        legitimate = Legitimate(port, tls_context(certs))
        task = asyncio.create_task(legitimate.run())
        while not stop.is_set():
            await asyncio.sleep(0.05)
        legitimate.stop.set()
        await task
        results.put((legitimate.pooled, legitimate.fresh))
    asyncio.run(main())


async def run_attack(name, binary, certs):
    server = Server(binary, certs)
    context = tls_context(certs)
    await asyncio.sleep(0.3)
    baseline = server.status("VmRSS")
    stop, results = multiprocessing.Event(), multiprocessing.Queue()
    legitimate = multiprocessing.Process(target=legitimate_process, args=(server.port, certs, stop, results))
    legitimate.start()
    await asyncio.sleep(0.5)
    started = time.time()
    await attack(name, server.port, context, certs)
    stop.set()
    pooled, fresh = results.get(timeout=30)
    legitimate.join()
    peak = server.status("VmHWM")
    after = server.status("VmRSS")
    alive = server.stop()
    print(f"| {name} | {baseline:.1f} | {peak:.1f} | {after:.1f} | {time.time() - started:.0f} s | "
          f"{Legitimate.summary(pooled)} | {Legitimate.summary(fresh)} | {'yes' if alive else 'NO'} |",
          flush=True)


async def descriptor_exhaustion(binary, certs):
    """With 64 file descriptors, 200 connections exhaust them: the accept loop must back off
    (a handful of log lines, not millions) and /healthz must stay answerable."""
    server = Server(binary, certs, {"nofile": 64})
    holders = []
    for _ in range(200):
        try:
            holders.append(socket.create_connection(("127.0.0.1", server.port), timeout=1))
        except OSError:
            break
    time.sleep(7)
    lines = server.log_lines()
    cpu = sum(float(field) for field in open(f"/proc/{server.process.pid}/stat").read().split()[13:15]) / os.sysconf("SC_CLK_TCK")
    for holder in holders:
        holder.close()
    time.sleep(1.5)
    try:
        probe = socket.create_connection(("127.0.0.1", server.probe_port), timeout=2)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        healthy = probe.recv(100).startswith(b"HTTP/1.1 200")
    except OSError:
        healthy = False
    peak = server.status("VmHWM")
    alive = server.stop()
    print(f"| descriptors exhausted (ulimit 64, 200 connections, 7 s) | - | {peak:.1f} | - | 7 s | "
          f"{lines} log lines, {cpu:.2f} s CPU | /healthz after: {'200' if healthy else 'FAILED'} | {'yes' if alive else 'NO'} |")


def main():
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="target/release/dbservice-operator")
    parser.add_argument("--only", help="run only the attacks whose name contains this")
    arguments = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with tempfile.TemporaryDirectory() as certs:
        subprocess.run([arguments.binary, "certs", "--out", certs], check=True, stdout=subprocess.DEVNULL)
        print("| attack | RSS before (MiB) | peak RSS (MiB) | RSS after (MiB) | duration | legitimate, pooled connection | legitimate, new connection each | alive |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name in ATTACKS:
            if arguments.only and arguments.only not in name:
                continue
            asyncio.run(run_attack(name, arguments.binary, certs))
        if not arguments.only or arguments.only in "descriptors":
            asyncio.run(descriptor_exhaustion(arguments.binary, certs))


if __name__ == "__main__":
    sys.exit(main())
