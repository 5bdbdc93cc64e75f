"""Serving throughput and latency: `keras-transformers serve` with continuous
batching, the same server one request at a time, and `transformers serve`.

    python benchmarks/bench_serve.py --clients 1,4,8 --requests 4 --json /tmp/serve.json
    KERAS_BACKEND=jax python benchmarks/bench_serve.py --contenders ours_batched,ours_single
    python benchmarks/bench_serve.py --quick            # tiny model, ~1-2 minutes

Contenders (`--contenders`), each an HTTP server process of its own on
127.0.0.1, started one after another (never two at once), on the same cores
(no pinning, no thread limits: every library's default), float32:

- `ours_batched`: `keras-transformers serve DIR --slots 8` (`--slots`):
  requests join one continuously batched decoding loop; the Keras backend
  is `KERAS_BACKEND` (or `~/.keras/keras.json`'s);
- `ours_single`: the same server with `--slots 1`: requests queue and are
  decoded one at a time;
- both with the server's defaults: programs compiled before serving
  (warm-up) and the cache rows of recent prompts kept (`--prefix-memory`);
  `--ours-args` adds arguments to both (e.g. `--ours-args="--no-warm-up
  --prefix-memory 0"`). The workload repeats its prompts (and SmolLM2's
  chat template starts each with the same system prompt), so after the
  untimed warm-up every prompt begins with a kept one;
- `hf_serve`: `transformers serve DIR --continuous-batching --device cpu
  --dtype float32` (eager PyTorch, paged attention, the model in a child
  process). On a CPU, transformers sizes that cache to 60% of the machine's
  total memory, whatever other processes hold (on a shared machine the
  kernel then kills it for memory); `--cb-num-blocks` bounds it to
  `--hf-cache-tokens` tokens (default: twice our cache, 2 x slots x
  max-length; 0: transformers' default);
- `hf_serve_plain`: `transformers serve` without `--continuous-batching`
  (not in the default list).

A contender that cannot start (a missing dependency, a server that exits)
is reported as unavailable, with the reason, and left out of the ratios.

Model (`--model`): `smollm2` (SmolLM2-135M-Instruct's real weights, the
directory `examples/real_checkpoints.py` builds), `tiny` (a 2-layer Llama
layout with random weights and a BPE tokenizer trained on the prompts,
exported as a Hugging Face directory with a chat template, built in a
subprocess into a temporary directory: every contender can serve it), or
the path of a Hugging Face model directory.

Workload, measured by the `openai` client (`AsyncOpenAI`) in this process:
for each `--clients` level C, C clients send `--requests` R chat requests
each, one after another (`max_tokens`, temperature 0, `stream=True`, usage
in the last chunk), prompts taken in turn from a fixed list. Before the
timed levels each server answers every prompt of the list once
(`max_tokens` 4) and one request of the full `max_tokens`, not counted:
compilation and first-call costs. Per contender and level: generated
tokens per second (completion tokens of all requests / wall time of the
level), time to first token (the first chunk with text; mean, p50, p90),
mean request latency, and the server process's CPU seconds per generated
token and its resident memory after the last level (Linux; all processes of
its session). Ratios compare tokens/s within the run: `ours_batched` over
`ours_single` and over `hf_serve` at each level. `--rounds N` starts every
server N times, contenders in turn (A B C, A B C): tokens/s is the median
over rounds, latencies pool every request.

The clients run in this process on the same cores as the server, for every
contender alike: on a small machine their share of the CPU is part of what
is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("ours_batched", "ours_single", "hf_serve", "hf_serve_plain")
PROMPTS = (
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator keeps food cold.",
    "Describe the water cycle step by step.",
    "What were the main causes of the French Revolution?",
    "Give me a recipe for banana bread.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a poem about the ocean at night.",
    "Describe a day in the life of a medieval blacksmith.",
)
TINY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Models


def smollm2_dir() -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    import real_checkpoints

    return real_checkpoints.smollm2()


def build_tiny(directory: str) -> None:
    """Writes the `tiny` model: a Hugging Face Llama directory with random
    weights, a BPE tokenizer trained on the prompts and a ChatML template
    (runs in a subprocess: this process imports no Keras)."""
    import keras

    from keras_transformers import from_preset
    from keras_transformers.convert import export_hf
    from keras_transformers.tokenizer import train_bpe

    keras.utils.set_random_seed(0)
    tokenizer = train_bpe(
        list(PROMPTS) * 8,
        vocabulary_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        end_token="<|im_end|>",
    )
    lm = from_preset(
        "gpt_llama_tiny",
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=256,
    )
    lm.tokenizer = tokenizer
    export_hf(lm, directory)
    (Path(directory) / "chat_template.jinja").write_text(TINY_TEMPLATE)


def model_directory(args, tmp: str) -> Path:
    if args.model == "smollm2":
        return smollm2_dir()
    if args.model == "tiny":
        directory = Path(tmp) / "tiny"
        command = [sys.executable, __file__, "--build-tiny", str(directory)]
        built = subprocess.run(command, capture_output=True, text=True, check=False)
        if built.returncode:
            raise SystemExit(f"building the tiny model failed:\n{built.stderr[-3000:]}")
        return directory
    directory = Path(args.model)
    if not (directory / "config.json").is_file():
        raise SystemExit(
            f"--model {args.model}: not smollm2, tiny or a Hugging Face directory"
        )
    return directory


# Servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keras_backend() -> str:
    """The Keras backend our servers run (without importing Keras)."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    config = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "keras.json"
    try:
        return json.loads(config.read_text()).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def missing_dependency(name: str) -> str | None:
    """Why contender `name` cannot run here, or None."""
    import importlib.util

    if name.startswith("ours"):
        needed = ("keras_transformers", "starlette", "uvicorn")
        extra = "pip install 'keras-transformers[serve]'"
    else:
        needed = ("transformers", "torch", "fastapi", "uvicorn", "pydantic", "openai")
        extra = "pip install 'transformers[serving]'"
    for module in needed:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({extra})"
    return None


def server_command(name: str, args, directory: Path, port: int) -> list:
    """The command line of contender `name`'s server, serving `directory`
    under the model name `str(directory)`."""
    if name.startswith("ours"):
        slots = args.slots if name == "ours_batched" else 1
        # The tiny model's tokenizer is our BPETokenizer, which does not read
        # chat_template.jinja: the server is given the same file.
        template = directory / "chat_template.jinja"
        return [
            sys.executable,
            "-m",
            "keras_transformers.cli",
            "serve",
            str(directory),
            "--port",
            str(port),
            "--slots",
            str(slots),
            "--max-length",
            str(args.max_length),
            "--model-name",
            str(directory),
            *(["--chat-template", str(template)] if args.model == "tiny" else []),
            *args.ours_args.split(),
        ]
    transformers = shutil.which("transformers")
    launcher = (
        [transformers] if transformers else [sys.executable, "-m", "transformers"]
    )
    command = [*launcher, "serve", str(directory), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--device", "cpu", "--dtype", "float32"]
    command += ["--max-model-len", str(args.max_length), "--log-level", "warning"]
    if name == "hf_serve":
        command.append("--continuous-batching")
        if args.hf_cache_tokens:  # blocks of 256 tokens (page_size) per layer
            blocks = -(-args.hf_cache_tokens // 256)
            command += ["--cb-num-blocks", str(blocks)]
    return command


class Server:
    """A server process on 127.0.0.1, its output in `log`; a context manager
    that stops it (its whole process group) on exit."""

    def __init__(self, name, args, directory, log: Path):
        self.port = free_port()
        self.command = server_command(name, args, directory, self.port)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until `GET /v1/models` answers; raises RuntimeError (with
        the log's tail) if the process exits or the time runs out."""
        import openai

        client = openai.OpenAI(
            base_url=self.base_url, api_key="none", max_retries=0, timeout=10
        )
        start = time.perf_counter()
        while True:
            try:
                client.models.list()
                return time.perf_counter() - start
            except openai.APIError:  # not listening yet, or not ready
                pass
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"exited with {self.process.returncode}: {self.tail()}"
                )
            if time.perf_counter() - start > timeout:
                raise RuntimeError(f"not ready after {timeout:.0f} s: {self.tail()}")
            time.sleep(0.5)

    def tail(self, lines: int = 8) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _session(self):
        """`/proc/PID` of every process of the server's session (the server
        and its children: `transformers serve` runs the model in a child)."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[3]) == self.process.pid:
                yield stat.parent, fields

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds so far of the server's processes (Linux;
        None elsewhere)."""
        ticks = sum(int(f[11]) + int(f[12]) for _, f in self._session())
        return ticks / os.sysconf("SC_CLK_TCK") if ticks else None

    def rss_mib(self) -> float | None:
        """Resident memory of the server's processes now, in MiB (Linux)."""
        total = 0
        for directory, _ in self._session():
            try:
                for line in (directory / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return total / 1024 if total else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


# Clients


async def chat(client, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat request: its time to first text, latency and
    token counts."""
    start = time.perf_counter()
    first, usage, pieces = None, None, 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
            if first is None:
                first = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage
    return {
        "ttft_s": first,
        "latency_s": time.perf_counter() - start,
        "completion_tokens": usage.completion_tokens if usage else pieces,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "usage_reported": usage is not None,
    }


async def warm_up(base_url: str, model: str, max_tokens: int) -> None:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        for prompt in PROMPTS:
            await chat(client, model, prompt, min(4, max_tokens))
        await chat(client, model, PROMPTS[0], max_tokens)


async def level(base_url, model, clients, requests, max_tokens) -> dict:
    """`clients` clients, each sending `requests` requests in sequence;
    client i's j-th request asks prompt (i + j * clients) mod len(PROMPTS)."""
    from openai import AsyncOpenAI

    done = []

    async def client_loop(client, i):
        for j in range(requests):
            prompt = PROMPTS[(i + j * clients) % len(PROMPTS)]
            done.append(await chat(client, model, prompt, max_tokens))

    async with AsyncOpenAI(
        base_url=base_url, api_key="none", max_retries=0, timeout=3600
    ) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client, i) for i in range(clients)))
        wall = time.perf_counter() - start
    return {"wall_s": wall, "requests": done}


# Statistics


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100), linear between ranks (NumPy's default)."""
    values = sorted(values)
    if not values:
        return None
    position = (len(values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def summarize(rounds: list) -> dict:
    """Figures of one contender at one level from its rounds (each a
    `level()` result with `server_cpu_s`)."""
    requests = [r for one in rounds for r in one["requests"]]
    ttfts = [r["ttft_s"] for r in requests if r["ttft_s"] is not None]
    latencies = [r["latency_s"] for r in requests]
    per_round = [
        sum(r["completion_tokens"] for r in one["requests"]) / one["wall_s"]
        for one in rounds
    ]
    tokens = sum(r["completion_tokens"] for r in requests)
    cpu = [one["server_cpu_s"] for one in rounds]
    return {
        "requests": len(requests),
        "completion_tokens": tokens,
        "wall_s": [one["wall_s"] for one in rounds],
        "tokens_per_s_rounds": per_round,
        "tokens_per_s": statistics.median(per_round),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "latency_mean_s": statistics.fmean(latencies),
        "latency_p90_s": percentile(latencies, 90),
        "without_text": len(requests) - len(ttfts),
        "usage_reported": all(r["usage_reported"] for r in requests),
        "server_cpu_s_per_token": sum(cpu) / tokens
        if tokens and None not in cpu
        else None,
    }


# Runs


def run_contender(name, args, directory, log_dir, round_index) -> dict:
    """Starts contender `name`'s server, warms it up, runs every level, stops
    it; returns its raw results, or `{"unavailable": reason}`."""
    reason = missing_dependency(name)
    if reason:
        return {"unavailable": reason}
    from openai import APIError

    log = Path(log_dir) / f"{name}_{round_index}.log"
    model = str(directory)
    with Server(name, args, directory, log) as server:
        out = {"command": server.command}
        try:
            out["start_s"] = server.wait_ready(args.start_timeout)
            start = time.perf_counter()
            asyncio.run(warm_up(server.base_url, model, args.max_tokens))
            out["warmup_s"] = time.perf_counter() - start
        except (RuntimeError, APIError) as error:  # a server that does not serve
            reason = f"{type(error).__name__}: {error}"
            if not isinstance(error, RuntimeError):  # its log says why
                reason += f" (server log: {server.tail(4)})"
            return {"unavailable": reason, **out}
        out["levels"] = {}
        for clients in args.clients:
            before = server.cpu_seconds()
            result = asyncio.run(
                level(server.base_url, model, clients, args.requests, args.max_tokens)
            )
            after = server.cpu_seconds()
            result["server_cpu_s"] = (
                after - before if None not in (before, after) else None
            )
            out["levels"][str(clients)] = result
            print(
                f"  {name} round {round_index + 1}, {clients} clients: "
                f"{sum(r['completion_tokens'] for r in result['requests'])} tokens "
                f"in {result['wall_s']:.1f} s",
                flush=True,
            )
        out["rss_mib"] = server.rss_mib()
        return out


def main(args):
    sys.path.insert(0, str(Path(__file__).parent))
    from _machine import all_cores, cpu_model, git_revision, load, versions

    contenders = args.contenders.split(",")
    for name in contenders:
        if name not in CONTENDERS:
            raise SystemExit(f"unknown contender {name!r}; choose from {CONTENDERS}")
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_model(),
        "cores": all_cores(),
        "keras_backend": keras_backend(),
        "load_start": load(),
        "versions": versions(),
        "git": git_revision(),
        "command": "python benchmarks/bench_serve.py " + " ".join(sys.argv[1:]),
        "model": args.model,
        "clients": args.clients,
        "requests_per_client": args.requests,
        "max_tokens": args.max_tokens,
        "max_length": args.max_length,
        "slots": args.slots,
        "hf_cache_tokens": args.hf_cache_tokens,
        "rounds": args.rounds,
    }
    print(
        f"{meta['date']}  {meta['cpu']} x{meta['cores']}  load {meta['load_start']}"
        f"  Keras backend {meta['keras_backend']}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    raw = {name: [] for name in contenders}
    unavailable = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = model_directory(args, tmp)
        meta["model_dir"] = str(directory)
        log_dir = Path(args.logs or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        for round_index in range(args.rounds):
            for name in contenders:
                if name in unavailable:
                    continue
                print(f"{name}: starting (round {round_index + 1})", flush=True)
                result = run_contender(name, args, directory, log_dir, round_index)
                if "unavailable" in result:
                    unavailable[name] = result["unavailable"]
                    print(f"{name}: unavailable: {result['unavailable']}", flush=True)
                    continue
                raw[name].append(result)
    meta["load_end"] = load()
    results = {}
    for name, runs in raw.items():
        if name in unavailable or not runs:
            continue
        results[name] = {
            "command": runs[0]["command"],
            "start_s": [run["start_s"] for run in runs],
            "warmup_s": [run["warmup_s"] for run in runs],
            "rss_mib": [run["rss_mib"] for run in runs],
            "levels": {
                c: summarize([run["levels"][c] for run in runs])
                for c in runs[0]["levels"]
            },
            "raw": [run["levels"] for run in runs],
        }
    ratios = compute_ratios(results, args.clients)
    print_tables(meta, results, unavailable, ratios)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "meta": meta,
                    "results": results,
                    "unavailable": unavailable,
                    "ratios": ratios,
                },
                indent=2,
            )
        )


def compute_ratios(results, clients) -> dict:
    """tokens/s of `ours_batched` over each other contender, per level."""
    ratios = {}
    ours = results.get("ours_batched")
    if not ours:
        return ratios
    for other in results:
        if other == "ours_batched":
            continue
        ratios[f"ours_batched/{other}"] = {
            str(c): ours["levels"][str(c)]["tokens_per_s"]
            / results[other]["levels"][str(c)]["tokens_per_s"]
            for c in clients
            if results[other]["levels"][str(c)]["tokens_per_s"] > 0
        }
    return ratios


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def print_tables(meta, results, unavailable, ratios) -> None:
    print(
        f"\n{meta['date']}, {meta['cpu']} x{meta['cores']} cores, load "
        f"{meta['load_start']} -> {meta['load_end']}, Keras backend "
        f"{meta['keras_backend']}, float32"
    )
    print(f"`{meta['command']}`")
    print(
        f"model {meta['model']}, {meta['requests_per_client']} requests per client, "
        f"max_tokens {meta['max_tokens']}, temperature 0, streamed; "
        f"{meta['rounds']} round(s)\n"
    )
    print(
        "| contender | clients | requests | tokens | tokens/s | TTFT mean ms "
        "| TTFT p50 ms | TTFT p90 ms | latency mean ms | server CPU ms/token |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, result in results.items():
        for clients, r in result["levels"].items():
            cpu = r["server_cpu_s_per_token"]
            print(
                f"| {name} | {clients} | {r['requests']} | {r['completion_tokens']} "
                f"| {r['tokens_per_s']:.1f} | {_ms(r['ttft_mean_s'])} "
                f"| {_ms(r['ttft_p50_s'])} | {_ms(r['ttft_p90_s'])} "
                f"| {_ms(r['latency_mean_s'])} | {'-' if cpu is None else f'{cpu * 1000:.1f}'} |"
            )
    for name, reason in unavailable.items():
        print(f"| {name} | unavailable: {reason} |  |  |  |  |  |  |  |  |")
    if ratios:
        names = list(ratios)
        print("\ntokens/s ratios (> 1: ours_batched is faster)\n")
        print("| clients | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for clients in meta["clients"]:
            cells = [ratios[n].get(str(clients)) for n in names]
            text = ["-" if c is None else f"{c:.2f}" for c in cells]
            print(f"| {clients} | " + " | ".join(text) + " |")
    for name, result in results.items():
        starts = ", ".join(f"{s:.1f}" for s in result["start_s"])
        warm = ", ".join(f"{s:.1f}" for s in result["warmup_s"])
        rss = ", ".join("-" if m is None else f"{m:,.0f}" for m in result["rss_mib"])
        command = " ".join(result["command"]).replace(sys.executable, "python")
        print(
            f"\n{name}: ready after {starts} s, warm-up {warm} s, resident "
            f"{rss} MiB at the end: `{command}`"
        )
    print()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=None,
        help="smollm2 (default), tiny (default with --quick) or a Hugging Face "
        "model directory",
    )
    parser.add_argument("--contenders", default="ours_batched,ours_single,hf_serve")
    parser.add_argument(
        "--clients",
        default="1,4,8",
        help="concurrent clients per level, comma-separated (default 1,4,8)",
    )
    parser.add_argument(
        "--requests", type=int, help="requests per client (default 4; --quick: 2)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="max_tokens per request (default 64; --quick: 16)",
    )
    parser.add_argument(
        "--slots", type=int, default=8, help="ours_batched's --slots (default 8)"
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=256,
        help="prompt plus reply tokens per request: ours' --max-length, "
        "transformers' --max-model-len (default 256)",
    )
    parser.add_argument(
        "--hf-cache-tokens",
        type=int,
        help="tokens hf_serve's paged KV cache holds (--cb-num-blocks; default: "
        "2 x slots x max-length; 0: transformers' default, 60%% of the "
        "machine's total memory on a CPU)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny model, 2 requests per client of 16 tokens",
    )
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument(
        "--ours-args",
        default="",
        help="more arguments for our servers, e.g. '--no-warm-up --prefix-memory 0' "
        "(compile on first use, keep no prompt rows)",
    )
    parser.add_argument("--logs", help="keep the servers' logs in this directory")
    parser.add_argument("--json")
    parser.add_argument("--build-tiny", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model = args.model or ("tiny" if args.quick else "smollm2")
    args.requests = args.requests or (2 if args.quick else 4)
    args.max_tokens = args.max_tokens or (16 if args.quick else 64)
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.hf_cache_tokens is None:
        args.hf_cache_tokens = 2 * args.slots * args.max_length
    return args


if __name__ == "__main__":
    parsed = parse_args()
    build_tiny(parsed.build_tiny) if parsed.build_tiny else main(parsed)
