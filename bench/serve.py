"""Online serving: `kermt serve` latency and throughput under 1, 8 and 64 concurrent clients, next to `kermt
predict`'s batch throughput on the same model and molecules, in one run.

    .venv/bin/python bench/serve.py [--checkpoint tests/data/kermt_upstream/ckpt_ft_cls.pt] [--seconds 15]
                                    [--predict_n 4000] [--serve_args "" --serve_args "--num_replicas 2" ...]

* ``kermt predict`` (a child process, its own local Ray cluster) on ``--predict_n`` molecules and on 10 times as
  many: wall times with start-up, and the steady rate of its batch pipeline, the extra molecules over the extra
  seconds (start-up cancels out);
* in this process, the library calls ``kermt predict`` makes (featurise, ``Ensemble.predict`` in batches of 32) on
  the same molecules: its rate without Ray's start-up, what a warm server compares with; and featurisation plus one
  forward of one molecule (the floor a single-molecule request can reach);
* ``kermt serve`` (a child process, its own local Ray cluster, SIGTERM at the end; one per ``--serve_args``
  configuration, one after the other): phases of ``--seconds`` each
  with 1 client sending 1 SMILES, then 1, 8 and 64 clients each sending requests of 1-10 SMILES (seeded) back to
  back: p50/p99 latency, requests/s, molecules/s, failed requests.

Molecules are upstream's sample SMILES (tests/data/kermt_upstream_splits/train_val.csv), cycled. Figures depend
on the machine and on what else runs on it: they are printed with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/data/kermt_upstream_splits/train_val.csv"
CHECKPOINT = ROOT / "tests/data/kermt_upstream/ckpt_ft_cls.pt"
CLIENTS = (1, 8, 64)


def sample_smiles() -> list[str]:
    with open(SOURCE) as f:
        return [row["smiles"] for row in csv.DictReader(f)]


def child_env() -> dict:
    # token auth off, as the tests run their clusters: the bench's two children need no more than loopback
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)  # its own local cluster, never one another process runs
    return env


def kermt_predict_s(checkpoint: Path, smiles: list[str], directory: Path) -> float:
    """Wall seconds of `kermt predict` on ``smiles`` (start-up included)."""
    data = directory / f"in_{len(smiles)}.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([["smiles"], *[[s] for s in smiles]])
    command = [sys.executable, "-m", "ray_app.cli", "predict", "--data_path", str(data), "--output_path",
               str(directory / f"out_{len(smiles)}.csv"), "--checkpoint_path", str(checkpoint)]
    start = time.perf_counter()
    done = subprocess.run(command, env=child_env(), cwd=directory, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"kermt predict failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def library_rates(checkpoint: Path, smiles: list[str], repeats: int = 30) -> tuple[float, float]:
    """(molecules/s of featurise + Ensemble.predict in batches of 32 on ``smiles``, median ms of one molecule),
    in this process."""
    from kermt.data.featurize import featurize_smiles
    from kermt.inference import Ensemble, plan_features, read_members

    members = read_members([checkpoint])
    generator = plan_features([m.spec for m in members]).generator
    ensemble = Ensemble(members, "cpu")
    times = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        ensemble.predict(featurize_smiles(smiles[:1], generator), 32)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    ensemble.predict(featurize_smiles(smiles, generator), 32)
    return len(smiles) / (time.perf_counter() - start), 1000 * statistics.median(times[3:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(checkpoint: Path, port: int, extra: list[str], directory: Path) -> subprocess.Popen:
    import httpx

    command = [sys.executable, "-m", "ray_app.cli", "serve", "--checkpoint_dir", str(checkpoint), "--port",
               str(port), *extra]
    log = open(directory / "serve.log", "w")
    process = subprocess.Popen(command, env=child_env(), cwd=directory, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"kermt serve exited with {process.returncode}: see {directory / 'serve.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    sys.exit("kermt serve did not answer /healthz within 600 s")


@dataclass
class Phase:
    name: str
    latencies_s: list[float]
    molecules: int
    failures: int
    seconds: float
    client_cores: float  # CPU the clients (this process) used meanwhile, in cores

    def line(self) -> str:
        ordered = sorted(self.latencies_s) or [float("nan")]
        p50 = 1000 * ordered[len(ordered) // 2]
        p99 = 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return (f"{self.name:<24} {len(self.latencies_s):>6} req  p50 {p50:8.1f} ms  p99 {p99:8.1f} ms  "
                f"{len(self.latencies_s) / self.seconds:7.1f} req/s  {self.molecules / self.seconds:8.1f} mol/s  "
                f"{self.failures} failed  (clients: {self.client_cores:.2f} cores)")


async def run_phase(url: str, name: str, clients: int, sizes: tuple[int, int], smiles: list[str],
                    seconds: float, seed: int) -> Phase:
    """``clients`` clients, each sending requests of ``sizes`` SMILES back to back for ``seconds``. The clients are
    aiohttp's (a Ray dependency), which costs this process about a third of httpx's CPU per request: the load
    generator shares the machine with the server, and what it spends the server cannot."""
    import aiohttp

    latencies, counts = [], {"molecules": 0, "failures": 0}
    deadline = time.perf_counter() + seconds

    async def client(http: aiohttp.ClientSession, rng: random.Random) -> None:
        while time.perf_counter() < deadline:
            batch = [smiles[rng.randrange(len(smiles))] for _ in range(rng.randint(*sizes))]
            start = time.perf_counter()
            try:
                async with http.post(url, json={"smiles": batch}) as response:
                    ok = response.status == 200 and len((await response.json())["predictions"]) == len(batch)
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
                counts["molecules"] += len(batch)
            else:
                counts["failures"] += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        cpu, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client(http, random.Random(seed + i)) for i in range(clients)))
        elapsed = time.perf_counter() - start
        client_cores = (time.process_time() - cpu) / elapsed
    return Phase(name, latencies, counts["molecules"], counts["failures"], elapsed, client_cores)


def serve_phases(url: str, smiles: list[str], seconds: float) -> list[Phase]:
    asyncio.run(run_phase(url, "warm-up", 4, (1, 10), smiles, 3, seed=99))
    phases = [asyncio.run(run_phase(url, "1 client, 1 SMILES", 1, (1, 1), smiles, seconds, seed=0))]
    for clients in CLIENTS:
        phases.append(asyncio.run(run_phase(url, f"{clients} client(s), 1-10 SMILES", clients, (1, 10), smiles,
                                            seconds, seed=clients)))
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each serving phase")
    parser.add_argument("--predict_n", type=int, default=4000, help="molecules of the smaller kermt predict run "
                        "(the larger has 10 times as many)")
    parser.add_argument("--serve_args", action="append", help="kermt serve flags of one configuration, e.g. "
                        "'--ingress haproxy --num_replicas 2'; repeat to compare several in this run (default: one "
                        "run with the defaults; '' is the defaults)")
    parser.add_argument("--serve_only", action="store_true", help="skip the kermt predict run")
    args = parser.parse_args()
    source = sample_smiles()
    cycled = [source[i % len(source)] for i in range(args.predict_n)]
    print(f"model {args.checkpoint}; {len(source)} distinct molecules; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        directory = Path(tmp)
        predict_s = steady = float("nan")
        if not args.serve_only:
            predict_s = kermt_predict_s(args.checkpoint, cycled, directory)
            large = [source[i % len(source)] for i in range(10 * args.predict_n)]
            large_s = kermt_predict_s(args.checkpoint, large, directory)
            steady = 9 * args.predict_n / (large_s - predict_s)
            print(f"kermt predict: {args.predict_n} molecules in {predict_s:.1f} s, {len(large)} in {large_s:.1f} s "
                  f"with start-up; steady rate {steady:.1f} mol/s")
        library, one_ms = library_rates(args.checkpoint, cycled)
        print(f"in process, kermt predict's library calls: {library:.1f} mol/s; featurise + one forward of one "
              f"molecule {one_ms:.1f} ms (median)")
        results = [(serve_args, serve_run(args.checkpoint, shlex.split(serve_args), source, args.seconds, directory))
                   for serve_args in args.serve_args or [""]]
    for serve_args, phases in results:
        print(f"kermt serve {serve_args or '(defaults)'}, {args.seconds:.0f} s per phase:")
        for phase in phases:
            print("  " + phase.line())
        busiest = phases[-1]
        rate = busiest.molecules / busiest.seconds
        print(f"  64 clients: {rate:.1f} mol/s = {rate / steady:.0%} of kermt predict's steady rate, "
              f"{rate / library:.0%} of its library calls' rate in one process; {busiest.failures} failed requests")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def serve_run(checkpoint: Path, serve_args: list[str], smiles: list[str], seconds: float,
              directory: Path) -> list[Phase]:
    """The serving phases against one `kermt serve` child started with ``serve_args``, stopped after them."""
    port = free_port()
    process = start_serve(checkpoint, port, serve_args, directory)
    try:
        return serve_phases(f"http://127.0.0.1:{port}/predict", smiles, seconds)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=180)

if __name__ == "__main__":
    main()
