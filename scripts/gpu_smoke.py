"""The GPU smoke: every stage of pasta end to end at a real model's shape, in a few minutes. The first thing to run on
a GPU machine (docs/full-scale.md).

    python scripts/gpu_smoke.py                           # CUDA, Qwen3-0.6B's shape with random weights
    python scripts/gpu_smoke.py --device cuda:1 --out /tmp/smoke
    python scripts/gpu_smoke.py --device cpu --no-compile # the same stages on the tiny Qwen3 twin (the test suite)

The model is `model=qwen3-0.6b-random` on CUDA (28 layers, hidden 1024, bf16, the embedded tokenizer: no hub needed)
and the tiny Qwen3 twin on CPU. In order, each stage timed and checked:

  1. annotate the project's sample with the structural teacher;
  2. SFT with LoRA (bf16 mixed precision on CUDA) on the annotated records;
  3. Baseline-SFT, full finetuning (bf16) on the same records without tags;
  4. one preference round from the LoRA model: candidates sampled by the asynchronous decoder, the embedding judge,
     BoNBoN through TRL;
  5. fork parity on the device: a forked answer replayed through the asynchronous decoder (eager and, unless
     --no-compile, compiled) equals one forward over its training layout, on a tiny twin of the same family whose
     output is sensitive to every mask (float32: within 1e-3; bfloat16: reported, and within 1 nat);
  6. evaluation of Baseline-SFT with the sequential decoder, and of the preference model with the asynchronous one;
  7. both decoders again with `decode.compile=true` (CUDA graphs on CUDA), their answers compared with the eager ones;
  8. the server (`pasta.serve`'s app, the asynchronous decoder) answering a chat request on 127.0.0.1.

Writes <out>/smoke.json: the device (GPU name, driver, torch, CUDA, transformers, TRL), each stage's seconds and what
it checked. A failing stage stops the run with its traceback and exit code 1; everything before it stays in <out>.
CPU compilation takes minutes per graph on a small machine, so the test suite runs `--device cpu --no-compile`
(tests/test_gpu_smoke.py); the compiled decoders are tested on CPU in tests/test_decoding.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pasta.errors import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """How much each stage does: enough to run every code path, no more (a smoke, not a measurement)."""

    model: tuple[str, ...]  # the model's overrides
    family: str  # its architecture: the fork-parity twin's family
    max_length: int  # training rows per example
    max_steps: int  # optimizer steps of each training run
    max_new_tokens: int  # tokens of each decoded answer
    num_eval: int  # evaluation prompts per run


SIZES = {
    "cuda": Sizes(("model=qwen3-0.6b-random",), "qwen3", max_length=512, max_steps=4, max_new_tokens=64, num_eval=4),
    "cpu": Sizes(("model=tiny", "model.architecture=qwen3", "model.random_init.weight_std=0.3"), "qwen3",
                 max_length=128, max_steps=2, max_new_tokens=8, num_eval=2),
}


class Smoke:
    """The run: its folder, its device, each stage's record."""

    def __init__(self, out: Path, device: str, compile: bool):
        self.out = out
        self.device = device
        self.cuda = device.startswith("cuda")
        self.compile = compile
        self.sizes = SIZES["cuda" if self.cuda else "cpu"]
        self.stages: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    @contextmanager
    def stage(self, name: str):
        """Time one stage; what it checked goes into the dict it yields."""
        print(f"\n== [{time.perf_counter() - self.started:6.1f} s] {len(self.stages) + 1}. {name}", flush=True)
        record: dict[str, Any] = {"stage": name}
        start = time.perf_counter()
        yield record
        record["seconds"] = round(time.perf_counter() - start, 2)
        self.stages.append(record)
        print(f"   done in {record['seconds']} s: {json.dumps({k: v for k, v in record.items() if k != 'stage'})}",
              flush=True)
        self.write()

    def overrides(self, *extra: str) -> list[str]:
        """What every stage's config takes: the model, the device, the output root."""
        return [*self.sizes.model, f"device={self.device}", f"paths.output_root={self.out}", *extra]

    def training(self, *extra: str) -> list[str]:
        precision = "bf16" if self.cuda else "no"
        return self.overrides(f"data.path={self.out / 'annotated.jsonl'}", f"stage.max_length={self.sizes.max_length}",
                              f"stage.max_steps={self.sizes.max_steps}", "stage.per_device_train_batch_size=2",
                              "stage.gradient_accumulation_steps=1", "stage.logging_steps=1", "stage.save_steps=1000",
                              f"stage.mixed_precision={precision}", *extra)

    def write(self) -> None:
        record = {"device": device_info(self.device), "compile": self.compile, "stages": self.stages,
                  "seconds": round(time.perf_counter() - self.started, 1)}
        (self.out / "smoke.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def device_info(device: str) -> dict[str, Any]:
    """The machine a result came from: what docs/results records beside any GPU number."""
    import torch
    import transformers
    import trl

    info = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "trl": trl.__version__}
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        info.update(gpu=torch.cuda.get_device_name(index), cuda=torch.version.cuda,
                    bf16=torch.cuda.is_bf16_supported(), driver=nvidia_driver())
    return info


def nvidia_driver() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def composed(config_name: str, overrides: list[str]):
    """The config `python -m pasta.<stage> <overrides>` would run, checked and applied as its entry point does."""
    from pasta.config import compose, setup_runtime
    from pasta.settings import check_settings

    cfg = compose(config_name, overrides)
    check_settings(cfg, config_name)
    setup_runtime(cfg)
    return cfg


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"gpu smoke: {what}")


def annotate(smoke: Smoke) -> None:
    from pasta.annotate import annotate
    from pasta.data import read_jsonl

    with smoke.stage("annotate the sample (structural teacher)") as record:
        output = smoke.out / "annotated.jsonl"
        annotate(composed("annotate", smoke.overrides("teacher=structural", "data=sample", "progress=false",
                                                       "on_reject=keep_unannotated", f"output={output}")))
        records = read_jsonl(output)
        record["records"] = len(records)
        record["with_promises"] = sum("<promise" in (r.get("annotated") or "") for r in records)
        check(record["with_promises"] > 0, "the structural teacher annotated no record with promises")


def train(smoke: Smoke, name: str, folder: str, *overrides: str) -> Path:
    from pasta.train import train

    with smoke.stage(name) as record:
        folder = smoke.out / folder
        final = train(composed("train", smoke.training(*overrides, f"output_dir={folder}")))
        info = json.loads((folder / "train_info.json").read_text())
        record["final"] = str(final)
        record["status"] = info["status"]
        record["train_loss"] = info.get("metrics", {}).get("train_loss")
        check(info["status"] == "done" and (Path(final) / "config.json").is_file(), f"{name}: no final model")
    return Path(final)


def preference_round(smoke: Smoke, sft: Path) -> Path:
    from pasta.train import train

    with smoke.stage("one preference round (async sampling, embedding judge, BoNBoN)") as record:
        cfg = composed("train", smoke.training(
            "stage=pref", f"model.path={sft}", "data.min_promises=1", "stage.rounds=1", "stage.prompts_per_round=2",
            "stage.num_samples=2", f"stage.max_new_tokens={smoke.sizes.max_new_tokens}", "stage.sample_batch_size=2",
            "stage.max_steps=1", f"output_dir={smoke.out / 'pref'}"))
        final = train(cfg)
        metrics = json.loads((smoke.out / "pref" / "round-1" / "metrics.json").read_text())
        record.update(final=str(final), num_pairs=metrics["num_pairs"])
        check((Path(final) / "config.json").is_file(), "the preference round wrote no final model")
    return Path(final)


FORKED = ('Two tips: <promise topic="routine"/><promise topic="room"/><async topic="routine">- Keep a fixed bedtime, '
          'even on weekends.\n</async><async topic="room">- Keep the room dark and cool.\n</async><sync/>Both help.')


def fork_parity(smoke: Smoke) -> None:
    """The asynchronous decoder's teacher forcing against one forward over the layout, on the device."""
    import copy

    import torch

    from pasta.config import compose
    from pasta.decoding import layout_attention, teacher_forced_logprobs
    from pasta.lang import (
        ReservationPolicy,
        add_tag_tokens,
        build_layout,
        collate_layouts,
        parse,
        sequence_logprobs,
        tokenize_document,
        written_counts,
    )
    from pasta.models import encode_prompt, load_tokenizer
    from pasta.models.tiny import build_tiny_model

    with smoke.stage("fork parity: the async decoder's replay of a forked answer = its layout forward") as record:
        tokenizer = copy.deepcopy(load_tokenizer(compose("generate", ["model=tiny"]).model))
        model = build_tiny_model(tokenizer, family=smoke.sizes.family, weight_std=0.3)
        add_tag_tokens(tokenizer, model)
        policy = ReservationPolicy()
        doc = tokenize_document(written_counts(parse(FORKED), tokenizer, policy.counts), tokenizer)
        prompt_ids = encode_prompt(tokenizer, "Give two tips for sleeping better.")
        for dtype, tolerance in ((torch.float32, 1e-3), (torch.bfloat16, 1.0)):
            typed = model.to(device=smoke.device, dtype=dtype).eval()
            layout = collate_layouts([build_layout(prompt_ids, doc, policy)], pad_id=0, dtype=dtype)
            batch = {k: v.to(smoke.device) for k, v in layout.items()}
            with torch.no_grad(), layout_attention(typed):  # as training runs it: each layer's window applied
                logits = typed(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                               attention_mask=batch["attention_mask"]).logits
            expected = sequence_logprobs(logits, batch["target_ids"]).sum().item()
            for compiled in (False, True) if smoke.compile else (False,):
                forced, stats = teacher_forced_logprobs(typed, tokenizer, prompt_ids, doc, policy, compile=compiled)
                total = forced.total().item()
                name = f"{str(dtype).removeprefix('torch.')}{'-compiled' if compiled else ''}"
                record[name] = {"replay": round(total, 4), "layout": round(expected, 4),
                                "max_token_diff": round(max_token_diff(forced, logits, batch, layout), 5),
                                "steps": stats.num_steps, "threads": stats.num_threads}
                check(stats.num_threads == 2, f"{name}: the replay forked {stats.num_threads} threads, not 2")
                check(torch.isfinite(torch.tensor(total)).item(), f"{name}: the replay's log-probability is not finite")
                check(record[name]["max_token_diff"] <= tolerance,
                      f"{name}: a token's log-probability differs by {record[name]['max_token_diff']} from the layout")


def max_token_diff(forced, logits, batch, layout) -> float:
    """The largest difference between a replayed token's log-probability and the layout's, over every thread."""

    from pasta.lang import IGNORE_INDEX, sequence_logprobs

    per_row = sequence_logprobs(logits, batch["target_ids"])[0].float().cpu()
    threads, trained = layout["thread_ids"][0], layout["target_ids"][0] != IGNORE_INDEX
    pieces = [(forced.main, per_row[(threads <= 0) & trained])]
    pieces += [(chunk, per_row[(threads == k + 1) & trained]) for k, chunk in enumerate(forced.chunks)]
    return max((replayed.float().cpu() - layout_rows).abs().max().item() for replayed, layout_rows in pieces)


def evaluate(smoke: Smoke, name: str, run: str, model: Path, decode: str, *extra: str) -> dict[str, str]:
    """Evaluate `model` with `decode` into <out>/eval/<run>; its answers by instruction."""
    from pasta.eval import evaluate

    with smoke.stage(name) as record:
        folder = smoke.out / "eval" / run
        cfg = composed("eval", smoke.overrides(
            f"model.path={model}", f"decode={decode}", "eval_data=sample", f"eval.limit={smoke.sizes.num_eval}",
            f"decode.max_new_tokens={smoke.sizes.max_new_tokens}", "eval.win_rate=false", "judge=embedding",
            f"output_dir={folder}", *extra))
        result = evaluate(cfg)
        outputs = json.loads((folder / "model_outputs.json").read_text())
        record.update(answers=len(outputs), folder=str(folder))
        check(len(outputs) == smoke.sizes.num_eval and all(isinstance(o["output"], str) for o in outputs),
              f"{name}: {len(outputs)} answers, not {smoke.sizes.num_eval}")
        record["summary_keys"] = sorted(result.get("summary", {}))[:8]
    return {o["instruction"]: o["output"] for o in outputs}


def serve(smoke: Smoke, model: Path) -> None:
    import uvicorn

    from pasta.serving.server import build_app

    with smoke.stage("serve: the async decoder answers a chat request") as record:
        app = build_app(composed("serve", smoke.overrides(
            f"model.path={model}", "decode=async", f"decode.max_new_tokens={smoke.sizes.max_new_tokens}",
            "served_model_name=smoke")))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 300
            while not server.started:
                check(thread.is_alive() and time.monotonic() < deadline, "the server did not start")
                time.sleep(0.05)
            body = json.dumps({"model": "smoke", "max_tokens": smoke.sizes.max_new_tokens,
                               "messages": [{"role": "user", "content": "Give three tips for sleeping well."}]})
            request = urllib.request.Request(f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions",
                                             data=body.encode(), headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as response:
                answer = json.load(response)
            choice = answer["choices"][0]
            record.update(status=200, finish_reason=choice["finish_reason"],
                          completion_tokens=answer["usage"]["completion_tokens"])
            check(isinstance(choice["message"]["content"], str) and answer["usage"]["completion_tokens"] > 0,
                  "the server's answer has no tokens")
        finally:
            server.should_exit = True
            thread.join(timeout=60)
            sock.close()


def run(out: Path, device: str, compile: bool) -> Smoke:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        from pasta.cli import fail
        from pasta.errors import PastaError

        fail(PastaError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; "
                        "install the CUDA build (PASTA_GPU=1 make setup) or pass --device cpu"))
    if out.exists():
        shutil.rmtree(out)  # a smoke starts from nothing: no stage may resume an earlier run's files
    out.mkdir(parents=True)
    smoke = Smoke(out, device, compile)
    print(json.dumps(device_info(device)), flush=True)
    annotate(smoke)
    sft = train(smoke, "SFT, LoRA", "sft", "stage=sft", "stage.finetune=lora")
    baseline = train(smoke, "Baseline-SFT, full finetuning", "baseline-sft", "stage=sft", "stage.finetune=full",
                     "data.strip_annotations=true")
    pref = preference_round(smoke, sft)
    fork_parity(smoke)
    sequential = evaluate(smoke, "evaluate Baseline-SFT, sequential decoder", "baseline-sft", baseline, "sequential",
                          "eval.generator=baseline-sft")
    run_dir = out / "eval" / "baseline-sft"
    against = (f"eval.reference={run_dir}", f"eval.sequential={run_dir}")
    asynchronous = evaluate(smoke, "evaluate the preference model, async decoder", "pasta", pref, "async", *against)
    if compile:
        for run, model, decode, eager in (("baseline-sft-compiled", baseline, "sequential", sequential),
                                          ("pasta-compiled", pref, "async", asynchronous)):
            answers = evaluate(smoke, f"evaluate with decode={decode} decode.compile=true", run, model, decode,
                               "decode.compile=true", f"eval.generator={run}", *against)
            # Greedy answers equal the eager ones up to float rounding (bf16 on CUDA may flip a near tie).
            smoke.stages[-1]["equal_to_eager"] = f"{sum(answers[k] == eager[k] for k in answers)} of {len(answers)}"
            smoke.write()
    serve(smoke, pref)
    print(f"\n== gpu smoke passed: {len(smoke.stages)} stages in {time.perf_counter() - smoke.started:.0f} s "
          f"on {device}; {out / 'smoke.json'}", flush=True)
    return smoke


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: the tiny twin)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu-smoke", help="output folder (emptied)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip decode.compile=true (CPU: inductor takes minutes per graph)")
    args = parser.parse_args(argv)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")  # every model and data set is local: a hub call would only hang
    run(args.out, args.device, args.compile)


if __name__ == "__main__":
    main()
